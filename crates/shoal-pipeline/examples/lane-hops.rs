//! What a lane hop adds to a token, apart from any model (`shoal_pipeline::dataplane::hopbench`):
//! a ring of `--stages` threads on real loopback lanes, each busy for `--compute-us` (± `--jitter`)
//! per step and passing one token's activations (`--hidden` wide, f16) on. Each `--round` runs the
//! ring with the readers' pacing on and off, and on bare loopback TCP with readers that never sleep
//! (the floor of a TCP hop here), in turn, and prints the added time per hop.
//!
//! usage: cargo run --release -p shoal-pipeline --example lane-hops -- [--stages 3] [--compute-us 2500]
//!        [--jitter 0.05] [--hidden 576] [--steps 1000] [--rounds 4]

use std::time::Duration;

use shoal_pipeline::dataplane::hopbench::{HopBench, Transport, run};

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut stages, mut compute_us, mut jitter, mut hidden, mut steps, mut rounds) =
        (3usize, 2500u64, 0.05f64, 576usize, 1000usize, 4usize);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_default();
        let bad = || -> ! {
            eprintln!("bad value {value:?} for {flag}");
            std::process::exit(2)
        };
        match flag.as_str() {
            "--stages" => stages = value.parse().unwrap_or_else(|_| bad()),
            "--compute-us" => compute_us = value.parse().unwrap_or_else(|_| bad()),
            "--jitter" => jitter = value.parse().unwrap_or_else(|_| bad()),
            "--hidden" => hidden = value.parse().unwrap_or_else(|_| bad()),
            "--steps" => steps = value.parse().unwrap_or_else(|_| bad()),
            "--rounds" => rounds = value.parse().unwrap_or_else(|_| bad()),
            _ => {
                eprintln!("unknown flag {flag}");
                std::process::exit(2)
            }
        }
    }
    println!(
        "{stages} stages, compute {compute_us} us ± {:.0} %, {hidden}-wide f16 activations, {steps} steps per run",
        jitter * 100.0
    );
    println!("| round | hop | per hop µs: p10 | median | p90 | p99 |");
    println!("|---|---|---|---|---|---|");
    let mut order = [
        Transport::Lane { pacing: true },
        Transport::Lane { pacing: false },
        Transport::Tcp,
    ];
    for round in 0..rounds {
        for transport in order {
            let bench = HopBench {
                stages,
                compute: Duration::from_micros(compute_us),
                jitter,
                hidden,
                warmup: steps / 10,
                rounds: steps,
                transport,
            };
            match run(&bench) {
                Ok(f) => println!(
                    "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
                    round + 1,
                    match transport {
                        Transport::Lane { pacing: true } => "lane, paced",
                        Transport::Lane { pacing: false } => "lane, unpaced",
                        Transport::Tcp => "bare TCP, polling",
                    },
                    f.quantile(0.1),
                    f.quantile(0.5),
                    f.quantile(0.9),
                    f.quantile(0.99)
                ),
                Err(e) => {
                    eprintln!("ring failed: {e}");
                    std::process::exit(1)
                }
            }
        }
        order.rotate_left(1);
    }
}
