use shoal_kernels::*;
use std::hint::black_box;
use std::time::Instant;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let backend = match args.get(1).map(|s| s.as_str()) {
        Some("avx2") => Backend::Avx2,
        Some("scalar") => Backend::Scalar,
        _ => Backend::AvxVnni,
    };
    let pool = ThreadPool::new(1);
    for (qtype, n, k, m) in [
        (QType::Q4_1, 576, 576, 1),
        (QType::Q4_1, 576, 1536, 1),
        (QType::Q8_0, 2048, 576, 1),
        (QType::Q4_1, 576, 576, 4),
        (QType::Q4_1, 576, 576, 16),
    ] {
        let data: Vec<u8> = (0..n * row_bytes(qtype, k))
            .map(|i| (i * 31 % 251) as u8 & 0x3f)
            .collect();
        let w = QMatrix {
            qtype,
            rows: n,
            cols: k,
            data: &data,
        };
        let x: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 - 8.0).collect();
        let acts = Activations::quantize(qtype.act_type(), &x, m, k).unwrap();
        let mut out = vec![0f32; m * n];
        let mut best = f64::MAX;
        for _ in 0..2000 {
            let t = Instant::now();
            matmul_quantized_with(backend, &w, &acts, &mut out, &pool).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
            black_box(&out);
        }
        let blocks = (n * k / 32 * m) as f64;
        println!(
            "{qtype:?} {n}x{k} m={m}: best {:.2} us, {:.3} ns/block-dot, {:.2} GB/s",
            best * 1e6,
            best * 1e9 / blocks,
            (n * row_bytes(qtype, k)) as f64 / best / 1e9
        );
    }
}
