//! `shoal bench --url`: the serving benchmark, like vLLM's `benchmark_serving`: bursts of C concurrent
//! streaming `/v1/completions` requests against any OpenAI-compatible server (shoal, llama-server, vLLM),
//! with time to first token, inter-token latency and aggregate throughput per concurrency level.
//!
//! Every request of a run has a distinct prompt of about 32 tokens (the first words differ, so no prefix
//! cache helps), is greedy and ignores end-of-sequence so it streams exactly `-n` tokens. A token is a
//! streamed chunk with text and no finish reason; the server's `usage.completion_tokens` is checked against
//! that count.

use std::time::{Duration, Instant};

use crate::args::{BenchArgs, parse_list};
use crate::client::{Target, Timed};
use crate::error::BenchError;
use crate::long_prompt;
use crate::prompts::{first_prompt, prompt};
use crate::stats::{median, percentile};

/// Figures of one burst of `c` concurrent requests.
#[derive(Debug, Clone, serde::Serialize)]
struct Burst {
    concurrency: usize,
    tokens: usize,
    /// Requests that streamed another number of tokens than asked, or than their usage says.
    short_or_mismatched: usize,
    prompt_tokens: f64,
    tok_s: f64,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
    itl_p50_ms: f64,
    itl_p99_ms: f64,
}

async fn burst(
    target: &Target<'_>,
    n: usize,
    c: usize,
    first_prompt: usize,
) -> Result<Burst, BenchError> {
    let start = Instant::now();
    let runs =
        futures::future::join_all((0..c).map(|k| target.stream(prompt(first_prompt + k), n, None)))
            .await
            .into_iter()
            .collect::<Result<Vec<Timed>, BenchError>>()?;
    let end = runs
        .iter()
        .filter_map(|r| r.tokens.last())
        .max()
        .copied()
        .unwrap_or(start);
    let tokens: usize = runs.iter().map(|r| r.tokens.len()).sum();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut ttft: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.tokens.first().map(|t| ms(*t - r.sent)))
        .collect();
    let mut itl: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.tokens.windows(2).map(|w| ms(w[1] - w[0])))
        .collect();
    ttft.sort_by(f64::total_cmp);
    itl.sort_by(f64::total_cmp);
    let prompt_tokens: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.prompt_tokens.map(|p| p as f64))
        .collect();
    Ok(Burst {
        concurrency: c,
        tokens,
        short_or_mismatched: runs
            .iter()
            .filter(|r| {
                r.tokens.len() != n
                    || r.completion_tokens
                        .is_some_and(|u| u as usize != r.tokens.len())
            })
            .count(),
        prompt_tokens: median(prompt_tokens),
        tok_s: tokens as f64 / (end - start).as_secs_f64().max(1e-9),
        ttft_p50_ms: percentile(&ttft, 0.5),
        ttft_p99_ms: percentile(&ttft, 0.99),
        itl_p50_ms: percentile(&itl, 0.5),
        itl_p99_ms: percentile(&itl, 0.99),
    })
}

/// Runs the serving benchmark against `url` (asking for `model`) at every level of `--concurrency`,
/// `-r` times, and prints the medians (a table, or JSON with every repetition); with `--long-prompt`,
/// the long-prompt scenario instead.
pub fn run(args: &BenchArgs, url: &str, model: &str) -> Result<(), BenchError> {
    let levels = parse_list(&args.concurrency, "--concurrency")?;
    let extra = match &args.extra {
        Some(s) => {
            match serde_json::from_str::<serde_json::Value>(s).map_err(BenchError::ExtraNotJson)? {
                serde_json::Value::Object(m) => m,
                _ => return Err(BenchError::ExtraNotObject),
            }
        }
        None => serde_json::Map::new(),
    };
    let target = Target {
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()?,
        url: format!("{}/v1/completions", url.trim_end_matches('/')),
        model,
        extra,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let reps = args.repetitions.max(1);
    // Warm-up: one request (the server may still be bringing weights into its caches); its prompt is
    // never one a measured request uses.
    rt.block_on(burst(&target, args.gen_tokens.min(8), 1, usize::MAX >> 8))?;
    if let Some(words) = args.long_prompt {
        return rt.block_on(long_prompt::run(&target, args, url, words, reps));
    }
    let mut all: Vec<Vec<Burst>> = vec![Vec::new(); levels.len()];
    let mut next_prompt = first_prompt(args.prompt_offset);
    rt.block_on(async {
        for _ in 0..reps {
            for (i, &c) in levels.iter().enumerate() {
                all[i].push(burst(&target, args.gen_tokens, c, next_prompt).await?);
                next_prompt += c;
            }
        }
        Ok::<_, BenchError>(())
    })?;
    let med = |bs: &[Burst], f: fn(&Burst) -> f64| median(bs.iter().map(f).collect());
    let single = levels
        .iter()
        .position(|&c| c == 1)
        .map(|i| med(&all[i], |b| b.tok_s));
    if args.json {
        let rows: Vec<_> = levels
            .iter()
            .zip(&all)
            .map(|(&c, bs)| {
                serde_json::json!({
                    "concurrency": c,
                    "tok_s": med(bs, |b| b.tok_s),
                    "ttft_p50_ms": med(bs, |b| b.ttft_p50_ms),
                    "ttft_p99_ms": med(bs, |b| b.ttft_p99_ms),
                    "itl_p50_ms": med(bs, |b| b.itl_p50_ms),
                    "itl_p99_ms": med(bs, |b| b.itl_p99_ms),
                    "prompt_tokens": med(bs, |b| b.prompt_tokens),
                    "repetitions": bs,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "url": url, "gen_tokens": args.gen_tokens, "results": rows })
            )?
        );
    } else {
        println!(
            "{url}: C concurrent streams of {} tokens, median of {reps}",
            args.gen_tokens
        );
        println!(
            "    C  prompt tok    tok/s  vs C=1  TTFT p50 ms  TTFT p99 ms  ITL p50 ms  ITL p99 ms  short"
        );
        for (&c, bs) in levels.iter().zip(&all) {
            let tok_s = med(bs, |b| b.tok_s);
            let ratio = single.map_or(f64::NAN, |s| tok_s / s);
            println!(
                "{c:>5}  {:>10.0}  {tok_s:>7.1}  {ratio:>5.2}x  {:>11.1}  {:>11.1}  {:>10.2}  {:>10.2}  {:>5}",
                med(bs, |b| b.prompt_tokens),
                med(bs, |b| b.ttft_p50_ms),
                med(bs, |b| b.ttft_p99_ms),
                med(bs, |b| b.itl_p50_ms),
                med(bs, |b| b.itl_p99_ms),
                bs.iter().map(|b| b.short_or_mismatched).sum::<usize>()
            );
        }
    }
    let short: usize = all.iter().flatten().map(|b| b.short_or_mismatched).sum();
    if short != 0 {
        return Err(BenchError::ShortRequests { count: short });
    }
    Ok(())
}
