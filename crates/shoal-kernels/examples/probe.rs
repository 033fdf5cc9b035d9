//! Runs the compute probe with its default settings and prints what `shoal serve` would publish:
//! `cargo run -p shoal-kernels --example probe -- [THREADS] [BATCH_TYPE]` (threads default to the
//! available cores; batch type e.g. `Q8_0`, default `Q4_0`).

use shoal_kernels::{ProbeConfig, QType, ThreadPool, probe};

fn main() {
    let mut args = std::env::args().skip(1);
    let threads = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut cfg = ProbeConfig::default();
    if let Some(name) = args.next() {
        match QType::ALL
            .into_iter()
            .find(|q| q.name().eq_ignore_ascii_case(&name))
        {
            Some(q) => cfg.batch_type = q,
            None => {
                eprintln!("unknown weight type {name}");
                std::process::exit(2);
            }
        }
    }
    let pool = ThreadPool::new(threads);
    match probe(&pool, &cfg) {
        Ok(r) => {
            println!("backend {} threads {}", r.backend.name(), r.threads);
            for t in &r.rates {
                println!("{:>5}  {:7.2} GB/s", t.qtype.name(), t.bytes_per_s / 1e9);
            }
            println!(
                "{} x {} rows: {:.1} GFLOP/s",
                cfg.batch_type.name(),
                cfg.batch_rows,
                r.flops_per_s / 1e9
            );
            println!("probe took {:.0} ms", r.elapsed.as_secs_f64() * 1e3);
        }
        Err(e) => {
            eprintln!("probe failed: {e}");
            std::process::exit(1);
        }
    }
}
