//! The `shoal` binary end to end: chat in-process and against a running server, bench's JSON, and
//! clear errors for bad arguments.

use std::process::{Command, Stdio};
use std::time::Duration;

use shoal_testkit::fixtures::model_path;
use shoal_testkit::process::{KillOnDrop, line_starting_with};

fn shoal() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shoal"));
    c.env("SHOAL_LOG", "warn");
    c
}

fn model_arg() -> String {
    model_path().display().to_string()
}

#[test]
fn chat_streams_a_greedy_answer() {
    let out = shoal()
        .args([
            "chat",
            "What is the capital of France?",
            "--model",
            &model_arg(),
        ])
        .args(["--temperature", "0", "--max-tokens", "12", "--threads", "1"])
        .output()
        .expect("run shoal chat");
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // The golden chat answer for this prompt (llama.cpp, greedy) starts like this.
    assert!(text.starts_with("L'Étoile"), "got {text:?}");
}

#[test]
fn bench_prints_parseable_figures() {
    let out = shoal()
        .args([
            "bench",
            "--model",
            &model_arg(),
            "--threads",
            "1",
            "-p",
            "16",
            "-n",
            "8",
            "-r",
            "1",
            "--json",
        ])
        .output()
        .expect("run shoal bench");
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let row = &v["results"][0];
    assert_eq!(row["threads"], 1);
    for key in [
        "prefill_tok_s",
        "decode_tok_s",
        "ttft_ms",
        "itl_p50_ms",
        "itl_p99_ms",
    ] {
        let x = row[key].as_f64().unwrap_or(f64::NAN);
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    }
    assert!(row["itl_p99_ms"].as_f64() >= row["itl_p50_ms"].as_f64());
}

#[test]
fn serve_then_chat_through_the_api() {
    let mut server = shoal()
        .args([
            "serve",
            "--model",
            &model_arg(),
            "--api-port",
            "0",
            "--threads",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start shoal serve");
    let stdout = server.stdout.take().expect("stdout");
    // Killed when the test ends, pass or fail.
    let _server = KillOnDrop(server);
    let url = line_starting_with(stdout, "shoal: listening on ", Duration::from_secs(60))
        .expect("no 'listening' line from shoal serve");
    // The server names the model after the file stem; an unknown model id is a clear error.
    fails_with_model_not_found(&[
        "chat",
        "What is the capital of France?",
        "--url",
        &url,
        "--model",
        "sm",
        "--max-tokens",
        "8",
    ]);
    let id = model_path()
        .file_stem()
        .map(|s| s.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let out = shoal()
        .args([
            "chat",
            "What is the capital of France?",
            "--url",
            &url,
            "--model",
            &id,
        ])
        .args(["--temperature", "0", "--max-tokens", "8"])
        .output()
        .expect("run shoal chat --url");
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("L'Étoile"));

    // The serving benchmark against the same server: every request streams exactly `-n` tokens.
    let bench = |extra: &[&str]| -> serde_json::Value {
        let out = shoal()
            .args(["bench", "--url", &url, "--model", &id, "-r", "1", "--json"])
            .args(extra)
            .output()
            .expect("run shoal bench --url");
        assert!(
            out.status.success(),
            "stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("bench JSON")
    };
    let v = bench(&["--concurrency", "1,3", "-n", "5"]);
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.len(), 2);
    for (r, c) in results.iter().zip([1u64, 3]) {
        assert_eq!(r["concurrency"], c);
        let rep = &r["repetitions"][0];
        assert_eq!(rep["tokens"], c * 5, "{rep}");
        assert_eq!(rep["short_or_mismatched"], 0, "{rep}");
        assert!(rep["prompt_tokens"].as_f64().unwrap_or(0.0) > 20.0, "{rep}");
        assert!(r["tok_s"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
    }
    // The long-prompt scenario: 4 streams alone, then with a long prompt arriving mid-way.
    let v = bench(&["--long-prompt", "60", "-n", "32"]);
    let reps = v["repetitions"].as_array().expect("repetitions");
    assert_eq!(reps.len(), 2, "{v}");
    assert_eq!(
        (
            reps[0]["with_long"].as_bool(),
            reps[1]["with_long"].as_bool()
        ),
        (Some(false), Some(true))
    );
    assert!(reps[0]["long_ttft_ms"].is_null(), "{v}");
    assert!(
        reps[1]["long_prompt_tokens"].as_u64().unwrap_or(0) > 60,
        "{v}"
    );
    assert!(reps[1]["long_ttft_ms"].as_f64().unwrap_or(0.0) > 0.0, "{v}");
    assert!(reps.iter().all(|r| r["short"] == 0), "{v}");
    // A model the server does not have: the server's error, and a failed run.
    fails_with_model_not_found(&[
        "bench",
        "--url",
        &url,
        "--model",
        "sm",
        "--concurrency",
        "1",
    ]);
}

/// Runs `shoal args`; it must fail, naming the server's `model_not_found` error.
fn fails_with_model_not_found(args: &[&str]) {
    let out = shoal().args(args).output().expect("run shoal");
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("model_not_found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_arguments_fail_with_a_message() {
    let out = shoal()
        .args(["serve", "--stages", "0-0"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let out = shoal()
        .args(["serve", "--model", "/nonexistent/model.gguf"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    let out = shoal()
        .args([
            "pull",
            "--model",
            "no-such-model",
            "--models-dir",
            "/tmp/shoal-test-none",
        ])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown model"));
}

#[test]
fn bench_second_turn_reports_both_ttfts() {
    let out = shoal()
        .args([
            "bench",
            "--model",
            &model_arg(),
            "--threads",
            "1",
            "-p",
            "24",
            "-r",
            "1",
            "--json",
            "--second-turn",
        ])
        .output()
        .expect("run shoal bench --second-turn");
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let row = &v["second_turn"][0];
    assert_eq!(row["turn2_tokens"], 24 + 8 + 16);
    for key in ["ttft_turn2_cached_ms", "ttft_turn2_uncached_ms", "ratio"] {
        let x = row[key].as_f64().unwrap_or(f64::NAN);
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    }
}
