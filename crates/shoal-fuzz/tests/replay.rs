//! Replays every committed fuzz input — the minimised corpus of each target and every crash the fuzzers
//! found (kept after the fix) — through the target's function, on stable, in the test command.

use std::path::PathBuf;

fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(kind)
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths
}

fn replay(target: &str) {
    let corpus = inputs("corpus", target);
    assert!(
        !corpus.is_empty(),
        "fuzz/corpus/{target} holds no inputs: run scripts/fuzz"
    );
    let crashes = inputs("artifacts", target);
    for path in corpus.iter().chain(&crashes) {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("{}", path.display());
        assert!(shoal_fuzz::run(target, &data), "unknown target {target}");
    }
    eprintln!(
        "{target}: {} corpus inputs, {} crash inputs replayed",
        corpus.len(),
        crashes.len()
    );
}

#[test]
fn every_target_has_a_harness_entry() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/fuzz_targets");
    for target in shoal_fuzz::TARGETS {
        assert!(
            dir.join(format!("{target}.rs")).is_file(),
            "fuzz/fuzz_targets/{target}.rs is missing"
        );
    }
}

#[test]
fn frame() {
    replay("frame");
}

#[test]
fn handshake() {
    replay("handshake");
}

#[test]
fn gguf() {
    replay("gguf");
}

#[test]
fn tokenizer() {
    replay("tokenizer");
}

#[test]
fn chat_template() {
    replay("chat_template");
}

#[test]
fn invite() {
    replay("invite");
}

#[test]
fn api() {
    replay("api");
}

/// The API seeds are valid requests: each is answered 200 by the real engine (so the fuzzer starts from
/// inputs that reach generation, not only from ones the first check refuses) — but those for cluster
/// routes, which a node without a cluster refuses in the API's own shape.
#[test]
fn api_seeds_reach_the_engine() {
    for seed in shoal_fuzz::seeds::seeds("api") {
        let route = shoal_fuzz::api::ROUTES[seed[0] as usize];
        let status = shoal_fuzz::api::answer(&seed).expect("a seed is not empty");
        if route.starts_with("/cluster/") || route == "/instance" {
            assert!(
                (400..500).contains(&status) || status == 503,
                "{route}: {status}"
            );
        } else {
            assert_eq!(
                status,
                200,
                "{route}: {}",
                String::from_utf8_lossy(&seed[1..])
            );
        }
    }
}
