//! `shoal bench` in process: prefill and decode throughput, TTFT and inter-token latency, llama-bench
//! style (random prompt tokens, `-p` prompt tokens, `-n` generated tokens), medians over repetitions;
//! or the second turn's TTFT with and without the prefix cache (`--second-turn`); or N concurrent
//! greedy sequences (`--streams`).

use std::path::Path;
use std::time::{Duration, Instant};

use shoal_engine::engine::{Device, EngineConfig};
use shoal_engine::{EngineHandle, Event, GenerateRequest, Prompt, SamplingParams};
use shoal_kernels::rng::SplitMix64;

use crate::args::{BenchArgs, parse_list};
use crate::error::BenchError;
use crate::stats::{median, percentile};

#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    threads: usize,
    prompt_tokens: usize,
    gen_tokens: usize,
    repetitions: usize,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    ttft_ms: f64,
    itl_p50_ms: f64,
    itl_p99_ms: f64,
}

/// `cpu` or `gpu:N`, as `--device` takes it.
fn device_name(device: Device) -> String {
    match device {
        Device::Cpu => "cpu".to_string(),
        Device::Gpu(i) => format!("gpu:{i}"),
    }
}

/// How many token ids prompts draw from: the first 49,000 (as before the tiny models), or the
/// whole vocabulary when it is smaller.
fn draw_range(engine: &EngineHandle) -> u64 {
    (engine.tokenizer().vocab_size() as u64).clamp(1, 49_000)
}

/// Runs one greedy request of `n` tokens; returns (time to first token, arrival times, token ids).
async fn timed(
    engine: &EngineHandle,
    model: &str,
    tokens: Vec<u32>,
    n: usize,
) -> Result<(Duration, Vec<Instant>, Vec<u32>), BenchError> {
    let start = Instant::now();
    let mut stream = engine.submit(GenerateRequest {
        model: model.to_string(),
        prompt: Prompt::Tokens(tokens),
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        max_tokens: Some(shoal_engine::request::max_tokens(n as u32)?),
        stop: Vec::new(),
        add_bos: false,
        ignore_eos: true,
        timeout: None,
        logits_processor: None,
        speculative: None,
    })?;
    let (mut arrivals, mut ids) = (Vec::with_capacity(n), Vec::with_capacity(n));
    while let Some(ev) = stream.next().await {
        match ev {
            Event::Token { id, .. } => {
                arrivals.push(Instant::now());
                ids.push(id);
            }
            Event::Done { .. } => break,
            Event::Error(e) => return Err(BenchError::RequestFailed(e)),
        }
    }
    let first = arrivals.first().copied().unwrap_or_else(Instant::now);
    Ok((first - start, arrivals, ids))
}

#[derive(Debug, Clone, serde::Serialize)]
struct TurnRow {
    threads: usize,
    turn1_tokens: usize,
    turn2_tokens: usize,
    repetitions: usize,
    ttft_turn2_cached_ms: f64,
    ttft_turn2_uncached_ms: f64,
    ratio: f64,
}

/// Turn 1, then turn 2 (turn 1 + its answer + new tokens): turn 2's TTFT.
async fn second_turn_ttft(
    engine: &EngineHandle,
    model: &str,
    turn1: &[u32],
    extra: &[u32],
) -> Result<f64, BenchError> {
    let (_, _, answer) = timed(engine, model, turn1.to_vec(), 8).await?;
    let mut turn2 = turn1.to_vec();
    turn2.extend_from_slice(&answer);
    turn2.extend_from_slice(extra);
    let (ttft, _, _) = timed(engine, model, turn2, 1).await?;
    Ok(ttft.as_secs_f64() * 1e3)
}

fn run_second_turn(
    args: &BenchArgs,
    path: &Path,
    id: &str,
    threads: &[usize],
    device: Device,
) -> Result<(), BenchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut rng = SplitMix64::new(7);
    let mut rows = Vec::new();
    for &t in threads {
        let config = |prefix| EngineConfig {
            threads: t.max(1),
            max_batch_tokens: args.prompt_tokens.max(1),
            prefix_cache_tokens: prefix,
            device,
            ..Default::default()
        };
        let cached = shoal_engine::engine::spawn_from_gguf(path, id, config(65_536))?;
        let plain = shoal_engine::engine::spawn_from_gguf(path, id, config(0))?;
        let vocab = draw_range(&plain);
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for _ in 0..args.repetitions.max(1) {
            let turn1: Vec<u32> = (0..args.prompt_tokens)
                .map(|_| (rng.next_u64() % vocab) as u32)
                .collect();
            let extra: Vec<u32> = (0..16).map(|_| (rng.next_u64() % vocab) as u32).collect();
            with.push(rt.block_on(second_turn_ttft(&cached, id, &turn1, &extra))?);
            without.push(rt.block_on(second_turn_ttft(&plain, id, &turn1, &extra))?);
        }
        let (c, u) = (median(with), median(without));
        rows.push(TurnRow {
            threads: t,
            turn1_tokens: args.prompt_tokens,
            turn2_tokens: args.prompt_tokens + 8 + 16,
            repetitions: args.repetitions,
            ttft_turn2_cached_ms: c,
            ttft_turn2_uncached_ms: u,
            ratio: c / u,
        });
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "model": id, "device": device_name(device), "second_turn": rows })
            )?
        );
    } else {
        println!(
            "model {id} on {}: second-turn TTFT, prefix cache on vs off",
            device_name(device)
        );
        println!("threads  turn2 tokens  cached ms  uncached ms  cached/uncached");
        for r in &rows {
            println!(
                "{:>7}  {:>12}  {:>9.1}  {:>11.1}  {:>14.2}x",
                r.threads,
                r.turn2_tokens,
                r.ttft_turn2_cached_ms,
                r.ttft_turn2_uncached_ms,
                r.ratio
            );
        }
    }
    Ok(())
}

#[derive(Debug, Clone, serde::Serialize)]
struct StreamsRow {
    threads: usize,
    streams: usize,
    prompt_tokens: usize,
    gen_tokens: usize,
    repetitions: usize,
    /// Generated tokens of all streams / wall time from launch to the last token.
    aggregate_tok_s: f64,
    /// Generated tokens after each stream's first / time from the last first token to the last token.
    decode_tok_s: f64,
    itl_p50_ms: f64,
    itl_p99_ms: f64,
}

/// N concurrent greedy sequences per repetition; aggregate and steady-state decode throughput.
fn run_streams(
    args: &BenchArgs,
    path: &Path,
    id: &str,
    threads: &[usize],
    streams: &[usize],
    device: Device,
) -> Result<(), BenchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut rng = SplitMix64::new(11);
    let mut rows = Vec::new();
    for &t in threads {
        let config = EngineConfig {
            threads: t.max(1),
            max_running: streams.iter().copied().max().unwrap_or(1).max(1),
            device,
            ..Default::default()
        };
        let engine = shoal_engine::engine::spawn_from_gguf(path, id, config)?;
        let vocab = draw_range(&engine);
        rt.block_on(timed(&engine, id, vec![1, 2, 3], 2))?;
        for &n in streams {
            let (mut agg, mut dec, mut itl) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..args.repetitions.max(1) {
                let prompts: Vec<Vec<u32>> = (0..n.max(1))
                    .map(|_| {
                        (0..args.prompt_tokens.max(1))
                            .map(|_| (rng.next_u64() % vocab) as u32)
                            .collect()
                    })
                    .collect();
                let start = Instant::now();
                let runs = rt.block_on(futures::future::try_join_all(
                    prompts
                        .into_iter()
                        .map(|p| timed(&engine, id, p, args.gen_tokens)),
                ))?;
                let all: Vec<&Vec<Instant>> = runs.iter().map(|(_, a, _)| a).collect();
                let last = all.iter().filter_map(|a| a.last()).max().copied();
                let last_first = all.iter().filter_map(|a| a.first()).max().copied();
                let total: usize = all.iter().map(|a| a.len()).sum();
                if let (Some(last), Some(last_first)) = (last, last_first) {
                    agg.push(total as f64 / (last - start).as_secs_f64());
                    let after: usize = all
                        .iter()
                        .map(|a| a.iter().filter(|&&x| x > last_first).count())
                        .sum();
                    dec.push(after as f64 / (last - last_first).as_secs_f64().max(1e-9));
                }
                for a in &all {
                    itl.extend(a.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3));
                }
            }
            itl.sort_by(f64::total_cmp);
            rows.push(StreamsRow {
                threads: t,
                streams: n,
                prompt_tokens: args.prompt_tokens,
                gen_tokens: args.gen_tokens,
                repetitions: args.repetitions,
                aggregate_tok_s: median(agg),
                decode_tok_s: median(dec),
                itl_p50_ms: percentile(&itl, 0.5),
                itl_p99_ms: percentile(&itl, 0.99),
            });
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "model": id, "device": device_name(device), "streams": rows })
            )?
        );
    } else {
        println!(
            "model {id} on {}: N concurrent sequences, -p {} -n {}",
            device_name(device),
            args.prompt_tokens,
            args.gen_tokens
        );
        println!("threads  streams  aggregate tok/s  decode tok/s  ITL p50 ms  ITL p99 ms");
        for r in &rows {
            println!(
                "{:>7}  {:>7}  {:>15.1}  {:>12.1}  {:>10.2}  {:>10.2}",
                r.threads, r.streams, r.aggregate_tok_s, r.decode_tok_s, r.itl_p50_ms, r.itl_p99_ms
            );
        }
    }
    Ok(())
}

/// Benchmarks the model `id` at `path` in engines started here on `--device`: `--second-turn`,
/// `--streams`, or by default prefill and decode of one sequence, at every `--threads` count; prints a
/// table or JSON (with the device it ran on).
pub fn run(args: &BenchArgs, id: &str, path: &Path) -> Result<(), BenchError> {
    let threads = parse_list(&args.threads, "--threads")?;
    let device = args.device.resolve_here();
    if args.second_turn {
        return run_second_turn(args, path, id, &threads, device);
    }
    if let Some(streams) = &args.streams {
        let streams = parse_list(streams, "--streams")?;
        return run_streams(args, path, id, &threads, &streams, device);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    let mut rng = SplitMix64::new(42);
    for &t in &threads {
        let config = EngineConfig {
            threads: t.max(1),
            max_batch_tokens: args.prompt_tokens.max(1),
            device,
            ..Default::default()
        };
        let engine = shoal_engine::engine::spawn_from_gguf(path, id, config)?;
        let vocab = draw_range(&engine);
        let row = rt.block_on(async {
            // Warm-up: touch every weight once.
            timed(&engine, id, vec![1, 2, 3], 2).await?;
            let (mut pp, mut tg, mut ttft, mut itl) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..args.repetitions.max(1) {
                let prompt: Vec<u32> = (0..args.prompt_tokens)
                    .map(|_| (rng.next_u64() % vocab) as u32)
                    .collect();
                let (first, _, _) = timed(&engine, id, prompt, 1).await?;
                pp.push(args.prompt_tokens as f64 / first.as_secs_f64());
                ttft.push(first.as_secs_f64() * 1e3);
                let start_tok = (rng.next_u64() % vocab) as u32;
                let (_, arrivals, _) = timed(&engine, id, vec![start_tok], args.gen_tokens).await?;
                if arrivals.len() >= 2 {
                    let span =
                        (*arrivals.last().unwrap_or(&arrivals[0]) - arrivals[0]).as_secs_f64();
                    tg.push((arrivals.len() - 1) as f64 / span);
                    itl.extend(
                        arrivals
                            .windows(2)
                            .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3),
                    );
                }
            }
            itl.sort_by(f64::total_cmp);
            Ok::<_, BenchError>(Row {
                threads: t,
                prompt_tokens: args.prompt_tokens,
                gen_tokens: args.gen_tokens,
                repetitions: args.repetitions,
                prefill_tok_s: median(pp),
                decode_tok_s: median(tg),
                ttft_ms: median(ttft),
                itl_p50_ms: percentile(&itl, 0.5),
                itl_p99_ms: percentile(&itl, 0.99),
            })
        })?;
        rows.push(row);
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "model": id, "device": device_name(device), "results": rows })
            )?
        );
    } else {
        println!("model {id} on {}", device_name(device));
        println!(
            "threads  pp{:<5} tok/s  tg{:<5} tok/s  TTFT ms  ITL p50 ms  ITL p99 ms",
            args.prompt_tokens, args.gen_tokens
        );
        for r in &rows {
            println!(
                "{:>7}  {:>13.1}  {:>13.1}  {:>7.1}  {:>10.2}  {:>10.2}",
                r.threads, r.prefill_tok_s, r.decode_tok_s, r.ttft_ms, r.itl_p50_ms, r.itl_p99_ms
            );
        }
    }
    Ok(())
}
