//! Matmul throughput per weight format, in GB/s of weight bytes read.
//!
//! `cargo run --release -p shoal-kernels --example kbench [-- --quick] [--threads=N] [--n=N]
//! [--k=K] [--types=Q4_1,Q4_K,...] [--m=1,16]`
//!
//! For each format, a `n × k` matrix (default 2048 × 2048, a Llama-1B projection) is multiplied
//! by `m` activation rows on a dedicated pool (default 1 thread), cycling through enough copies of
//! the weights to total ~128 MB (more than the L3 of the dev VMs), so weights stream from memory
//! as in decoding a model larger than the cache. Prints µs per call (best and median batch, and
//! the best batch's on-CPU time of the calling thread), the weight bytes per second (from the
//! on-CPU time with one thread — on a shared machine the wall time counts others' time slices —
//! else from the best wall time) and the ratio to `Q4_1` (the format of the SmolLM2 path).
//! `SHOAL_KERNEL_BACKEND` picks a slower backend.

#[path = "shared/timing.rs"]
mod timing;

use std::hint::black_box;

use timing::time_us;

use shoal_kernels::{Backend, PackedMatrix, QType, ThreadPool, row_bytes};
use shoal_testkit::rng::{Draw, SplitMix64};

/// Random but valid weights: random quant bytes, small finite f16 scales in the places each
/// format keeps them, plain formats from random floats.
fn weights(qtype: QType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let mut data = rng.bytes(n * row_bytes(qtype, k));
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let scales: &[(usize, f32)] = match qtype {
        QType::F32 => {
            for c in data.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.f32_in(-1.0, 1.0).to_le_bytes());
            }
            &[]
        }
        QType::F16 | QType::BF16 => {
            for c in data.chunks_exact_mut(2) {
                c.copy_from_slice(&f16(rng.f32_in(-1.0, 1.0) * 0.1));
            }
            &[]
        }
        QType::Q4_1 | QType::Q5_1 | QType::Q4_K | QType::Q5_K => &[(0, 0.01), (2, -0.08)],
        QType::Q4_0 | QType::Q5_0 | QType::Q8_0 => &[(0, 0.01)],
        QType::Q2_K => &[(80, 0.01), (82, 0.02)],
        QType::Q3_K => &[(108, 0.01)],
        QType::Q6_K => &[(208, 0.001)],
        QType::IQ4_NL | QType::IQ4_XS | QType::IQ3_S | QType::IQ3_XXS => &[(0, 0.01)],
        QType::IQ2_XXS | QType::IQ2_XS | QType::IQ2_S | QType::IQ1_S => &[(0, 0.01)],
        // MXFP4: an exponent byte of scales 2^-8 .. 2^-1 (random bytes would make products
        // overflow or go subnormal, timing the CPU's slow float paths instead of the kernel).
        QType::MXFP4 => {
            for b in data.chunks_exact_mut(qtype.type_size()) {
                b[0] = 119 + b[0] % 8;
            }
            &[]
        }
        // IQ1_M's d spread over its scale words, times the same.
        QType::IQ1_M => &[],
    };
    if !scales.is_empty() {
        for b in data.chunks_exact_mut(qtype.type_size()) {
            for &(at, v) in scales {
                b[at..at + 2].copy_from_slice(&f16(v));
            }
        }
    }
    data
}

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::args()
        .find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_owned))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (n, k) = (arg("n", 2048usize), arg("k", 2048usize));
    let threads = arg("threads", 1usize);
    let types: Vec<QType> = arg("types", String::new())
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            QType::ALL
                .into_iter()
                .chain(QType::IQ)
                .find(|t| t.name().eq_ignore_ascii_case(s))
                .unwrap_or_else(|| panic!("unknown type {s}"))
        })
        .collect();
    let types = if types.is_empty() {
        vec![
            QType::Q4_1,
            QType::Q8_0,
            QType::Q4_0,
            QType::Q5_0,
            QType::Q5_1,
            QType::Q4_K,
            QType::Q5_K,
            QType::Q6_K,
            QType::Q3_K,
            QType::Q2_K,
            QType::F16,
            QType::BF16,
        ]
    } else {
        types
    };
    let ms: Vec<usize> = arg("m", "1,16".to_string())
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let (batches, batch_s) = if quick { (3, 0.05) } else { (9, 0.2) };
    let pool = ThreadPool::new(threads);
    println!(
        "kbench: {n} x {k}, {threads} thread(s), backend {}, ~128 MB of weights per format",
        Backend::detect().name()
    );
    println!(
        "{:<6} {:>4} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "type", "m", "best µs", "median µs", "on-CPU µs", "GB/s", "vs Q4_1"
    );
    let mut q41 = std::collections::HashMap::new();
    for qtype in types {
        if qtype.try_row_bytes(k).is_err() {
            println!(
                "{:<6} skipped: k = {k} is not a multiple of {}",
                qtype.name(),
                qtype.block_size()
            );
            continue;
        }
        let bytes = n * row_bytes(qtype, k);
        let copies = (128 << 20) / bytes + 1;
        let mats: Vec<PackedMatrix> = (0..copies)
            .map(|c| {
                let data = weights(qtype, n, k, c as u64 + 1);
                PackedMatrix::from_rows(qtype, n, k, data).expect("matrix")
            })
            .collect();
        for &m in &ms {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut out = vec![0f32; m * n];
            let timing::Timing { best, median, cpu } = time_us(batches, batch_s, |i| {
                mats[i % copies]
                    .matmul(black_box(&x), m, &mut out, &pool)
                    .expect("matmul");
                black_box(&out);
            });
            // One thread: the on-CPU time is the kernel's own (others' time slices excluded).
            let t = if threads == 1 && cpu.is_finite() {
                cpu.min(best)
            } else {
                best
            };
            let gbs = bytes as f64 / t / 1e3;
            if qtype == QType::Q4_1 {
                q41.insert(m, gbs);
            }
            let ratio = q41
                .get(&m)
                .map_or(String::from("-"), |r| format!("{:.2}", gbs / r));
            println!(
                "{:<6} {:>4} {:>10.1} {:>10.1} {:>10.1} {:>8.2} {:>8}",
                qtype.name(),
                m,
                best,
                median,
                cpu,
                gbs,
                ratio
            );
        }
    }
}
