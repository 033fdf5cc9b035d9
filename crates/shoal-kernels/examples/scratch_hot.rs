use shoal_kernels::*;
use std::hint::black_box;
use std::time::Instant;
fn main() {
    let pool = ThreadPool::new(1);
    let (qtype, n, k) = (QType::Q4_1, 576, 576);
    let x: Vec<f32> = (0..k).map(|i| (i % 17) as f32 - 8.0).collect();
    let acts = Activations::quantize(qtype.act_type(), &x, 1, k).unwrap();
    let mut out = vec![0f32; n];
    for copies in [1usize, 8, 64, 320, 640] {
        let mats: Vec<Vec<u8>> = (0..copies)
            .map(|c| {
                (0..n * row_bytes(qtype, k))
                    .map(|i| ((i * 31 + c) % 251) as u8 & 0x3f)
                    .collect()
            })
            .collect();
        let mut best = f64::MAX;
        for rep in 0..5 {
            let t = Instant::now();
            let iters = 3000;
            for i in 0..iters {
                let w = QMatrix {
                    qtype,
                    rows: n,
                    cols: k,
                    data: &mats[(i + rep) % copies],
                };
                matmul_quantized(&w, &acts, &mut out, &pool).unwrap();
                black_box(&out);
            }
            best = best.min(t.elapsed().as_secs_f64() / iters as f64);
        }
        let bytes = n * row_bytes(qtype, k);
        println!(
            "copies {copies} ({:.1} MB): {:.2} us, {:.2} GB/s",
            (copies * bytes) as f64 / 1e6,
            best * 1e6,
            bytes as f64 / best / 1e9
        );
    }
}
