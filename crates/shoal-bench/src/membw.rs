//! `shoal bench --memory-bandwidth`: how fast this machine streams memory it does not cache, the
//! denominator of the decode roofline (weight bytes × tok/s ÷ read bandwidth).
//!
//! Each thread count reads one 1 GiB buffer (far larger than any L3 these machines have) split into
//! equal contiguous parts, one per thread, summing its `u64`s so no read can be skipped; the best of the
//! repetitions is reported (noise only ever slows a run down), in GB/s (10⁹ bytes).

use std::time::Instant;

use crate::args::{BenchArgs, parse_list};
use crate::error::BenchError;

/// Bytes read per measurement.
const BUFFER_BYTES: usize = 1 << 30;

/// Measures read bandwidth for every `--threads` count and prints it (a table, or JSON with `--json`).
pub fn run(args: &BenchArgs) -> Result<(), BenchError> {
    let threads = parse_list(&args.threads, "--threads")?;
    // Every page written once, so the reads below hit memory rather than the zero page.
    let buf: Vec<u64> = (0..BUFFER_BYTES / 8).map(|i| i as u64).collect();
    let mut rows = Vec::new();
    for &t in &threads {
        let t = t.max(1);
        let best = (0..args.repetitions.max(1))
            .map(|_| read_once(&buf, t))
            .fold(0f64, f64::max);
        rows.push((t, best));
    }
    if args.json {
        let results: Vec<_> = rows
            .iter()
            .map(|(t, gbs)| serde_json::json!({"threads": t, "read_gb_s": gbs}))
            .collect();
        println!("{}", serde_json::json!({ "memory_bandwidth": results }));
    } else {
        println!(
            "| threads | read GB/s (best of {}) |",
            args.repetitions.max(1)
        );
        println!("|---|---|");
        for (t, gbs) in rows {
            println!("| {t} | {gbs:.1} |");
        }
    }
    Ok(())
}

/// One pass over `buf` with `threads` readers; GB/s.
fn read_once(buf: &[u64], threads: usize) -> f64 {
    let part = buf.len().div_ceil(threads);
    let start = Instant::now();
    let total: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = buf.chunks(part).map(|c| s.spawn(move || sum(c))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(0))
            .fold(0u64, u64::wrapping_add)
    });
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(total);
    (buf.len() * 8) as f64 / secs / 1e9
}

/// A sum in eight independent lanes (so the loads, not an add chain, set the pace).
fn sum(c: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let chunks = c.chunks_exact(8);
    let tail = chunks.remainder();
    for ch in chunks {
        for (l, &v) in lanes.iter_mut().zip(ch) {
            *l = l.wrapping_add(v);
        }
    }
    tail.iter()
        .chain(lanes.iter())
        .fold(0u64, |a, &b| a.wrapping_add(b))
}
