//! The IQ formats and `MXFP4` (their dequantizers, ids and sizes are checked in `dequant.rs`):
//! the scalar dot product against the dequantized weights, and
//! every backend against the scalar one — bitwise for the 256-value formats (the same integer
//! sums and float steps), within rounding for the 32-value ones — at odd shapes and batch sizes.

mod common;

use common::{Rng, activations, dequantize_acts, random_raw};
use shoal_kernels::{
    Activations, Backend, PackedMatrix, QMatrix, QType, ThreadPool, dequantize_row, matmul,
    matmul_quantized_with, scalar, vec_dot_with,
};

/// One row of `qtype` (`k` values) · one activation row, in ggml bytes.
fn ggml_acts(qtype: QType, x: &[f32]) -> Vec<u8> {
    let a = Activations::quantize(qtype.act_type(), x, 1, x.len()).expect("acts");
    a.ggml_row(0).expect("row")
}

/// The scalar dot equals the dequantized weights · the dequantized activations, summed in f64,
/// within f32 rounding of the per-block float steps: ≤ 1e-5 of Σ|w·x| (plus 1e-6).
#[test]
fn scalar_iq_dot_matches_dequantized_product() {
    let mut rng = Rng::new(29);
    for qtype in QType::IQ {
        for k in [256, 512, 1280] {
            let w = random_raw(&mut rng, qtype, 1, k);
            let x = activations(&mut rng, k);
            let xq = ggml_acts(qtype, &x);
            let acts = Activations::quantize(qtype.act_type(), &x, 1, k).expect("acts");
            let xf = dequantize_acts(&acts, 1, k);
            let mut wf = vec![0f32; k];
            dequantize_row(qtype, &w, &mut wf).expect("decode");
            let want: f64 = wf
                .iter()
                .zip(&xf)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            let mag: f64 = wf
                .iter()
                .zip(&xf)
                .map(|(&a, &b)| f64::from((a * b).abs()))
                .sum();
            let got = scalar::vec_dot(qtype, k, &w, &xq);
            let tol = 1e-5 * mag + 1e-6;
            assert!(
                (f64::from(got) - want).abs() <= tol,
                "{qtype:?} k={k}: {got} vs {want} (tol {tol})"
            );
            assert!(
                mag > 0.0,
                "{qtype:?} k={k}: an all-zero product tests nothing"
            );
        }
    }
}

/// Every backend's `vec_dot` against the scalar one: bitwise for the 256-value formats (the same
/// integer sums and float steps), within rounding of the block order for `IQ4_NL` / `MXFP4`.
#[test]
fn every_backend_iq_dot_matches_scalar() {
    let mut rng = Rng::new(2911);
    for backend in Backend::supported() {
        for qtype in QType::IQ {
            for blocks in [1, 2, 3, 7, 11] {
                let k = blocks * qtype.block_size();
                let w = random_raw(&mut rng, qtype, 1, k);
                let x = activations(&mut rng, k);
                let xq = ggml_acts(qtype, &x);
                let want = scalar::vec_dot(qtype, k, &w, &xq);
                let got = vec_dot_with(backend, qtype, k, &w, &xq);
                if qtype.block_size() == 256 {
                    assert_eq!(got.to_bits(), want.to_bits(), "{backend:?} {qtype:?} k={k}");
                } else {
                    let mut wf = vec![0f32; k];
                    dequantize_row(qtype, &w, &mut wf).expect("decode");
                    let xf = dequantize_acts(
                        &Activations::quantize(qtype.act_type(), &x, 1, k).expect("acts"),
                        1,
                        k,
                    );
                    let mag: f32 = wf.iter().zip(&xf).map(|(a, b)| (a * b).abs()).sum();
                    let tol = 1e-5 * mag + 1e-6;
                    assert!(
                        (got - want).abs() <= tol,
                        "{backend:?} {qtype:?} k={k}: {got} vs {want} (tol {tol})"
                    );
                }
            }
        }
    }
}

/// The matmul of every backend (four-row and one-row kernels, thread splits, odd row counts)
/// equals the scalar backend's matmul, and each output equals the row's `vec_dot`.
#[test]
fn every_backend_iq_matmul_matches_scalar() {
    let mut rng = Rng::new(2912);
    let pool = ThreadPool::new(2);
    for qtype in QType::IQ {
        for (n, k, m) in [(5, 256, 1), (19, 512, 6), (33, 768, 13)] {
            let w = random_raw(&mut rng, qtype, n, k);
            let x = activations(&mut rng, m * k);
            let mat = QMatrix::new(qtype, n, k, &w).expect("matrix");
            let acts = Activations::quantize(qtype.act_type(), &x, m, k).expect("acts");
            let mut want = vec![0f32; m * n];
            matmul_quantized_with(Backend::Scalar, &mat, &acts, &mut want, &pool).expect("scalar");
            for r in 0..m {
                let xq = acts.ggml_row(r).expect("row");
                for j in 0..n {
                    let row = mat.row(j).expect("row");
                    let v = scalar::vec_dot(qtype, k, row, &xq);
                    assert_eq!(
                        v.to_bits(),
                        want[r * n + j].to_bits(),
                        "{qtype:?} ({r}, {j})"
                    );
                }
            }
            for backend in Backend::supported() {
                let mut got = vec![0f32; m * n];
                matmul_quantized_with(backend, &mat, &acts, &mut got, &pool).expect("matmul");
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    let tol = if qtype.block_size() == 256 {
                        0.0
                    } else {
                        1e-4 * e.abs() + 1e-5
                    };
                    assert!(
                        (g - e).abs() <= tol,
                        "{backend:?} {qtype:?} n={n} k={k} m={m} out[{i}]: {g} vs {e}"
                    );
                }
            }
            // The packed matrix (the engine's path) on the detected backend.
            let p = PackedMatrix::new(&mat).expect("packed");
            let mut got = vec![0f32; m * n];
            p.matmul(&x, m, &mut got, &pool).expect("packed matmul");
            let mut plain = vec![0f32; m * n];
            matmul(&mat, &x, m, &mut plain, &pool).expect("matmul");
            assert_eq!(got, plain, "{qtype:?} packed vs rows");
        }
    }
}

/// The SIMD backends agree bitwise for every IQ format, the 32-value ones included: AVX2 and
/// AVX-VNNI sum the same integers, and the AVX-512 kernels (two blocks or chunks per 512-bit
/// vector) keep the 256-bit kernels' two float chains of even and odd blocks in their two halves
/// (`IQ4_NL`, `MXFP4`) or their one float step per super-block. Dot products at odd block counts
/// (the lone last block of the 512-bit pairs) and matmuls through the one-, four- and many-row
/// kernels.
#[test]
fn simd_backends_agree_bitwise_on_iq_formats() {
    let simd: Vec<Backend> = Backend::supported()
        .into_iter()
        .filter(|b| *b != Backend::Scalar)
        .collect();
    eprintln!("SIMD backends compared: {simd:?}");
    let mut rng = Rng::new(2913);
    let pool = ThreadPool::new(2);
    for qtype in QType::IQ {
        for blocks in [1, 2, 3, 5, 8] {
            let k = blocks * qtype.block_size();
            let w = random_raw(&mut rng, qtype, 1, k);
            let xq = ggml_acts(qtype, &activations(&mut rng, k));
            let got: Vec<u32> = simd
                .iter()
                .map(|&b| vec_dot_with(b, qtype, k, &w, &xq).to_bits())
                .collect();
            assert!(
                got.windows(2).all(|p| p[0] == p[1]),
                "{qtype:?} k={k}: {got:?} on {simd:?}"
            );
        }
        for (n, k, m) in [(7, 256 * 3, 1), (9, 512, 5), (6, 256 * 5, 13)] {
            let w = random_raw(&mut rng, qtype, n, k);
            let x = activations(&mut rng, m * k);
            let mat = QMatrix::new(qtype, n, k, &w).expect("matrix");
            let acts = Activations::quantize(qtype.act_type(), &x, m, k).expect("acts");
            let outs: Vec<Vec<u32>> = simd
                .iter()
                .map(|&b| {
                    let mut out = vec![0f32; m * n];
                    matmul_quantized_with(b, &mat, &acts, &mut out, &pool).expect("matmul");
                    out.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            for (b, o) in simd.iter().zip(&outs) {
                assert_eq!(
                    o, &outs[0],
                    "{qtype:?} n={n} k={k} m={m}: {b:?} vs {:?}",
                    simd[0]
                );
            }
        }
    }
}

/// The batched matmuls of the 256-value formats (on AVX-512 VNNI: 16 weight rows in the lanes,
/// each super-block decoded once for every activation row) equal the scalar matmul bitwise, at
/// batch sizes around the tile widths and row counts that leave a partial group of 16, on one
/// thread and split over two.
#[test]
fn batched_iq_matmul_is_bitwise_scalar_at_every_batch_size() {
    let mut rng = Rng::new(2914);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for qtype in QType::IQ.into_iter().filter(|q| q.block_size() == 256) {
        for (n, k) in [(37, 256 * 3), (16, 256), (21, 512)] {
            let w = random_raw(&mut rng, qtype, n, k);
            let mat = QMatrix::new(qtype, n, k, &w).expect("matrix");
            for m in [1, 2, 3, 7, 16, 33] {
                let x = activations(&mut rng, m * k);
                let acts = Activations::quantize(qtype.act_type(), &x, m, k).expect("acts");
                let mut want = vec![0f32; m * n];
                matmul_quantized_with(Backend::Scalar, &mat, &acts, &mut want, &pools[0])
                    .expect("scalar");
                assert!(
                    want.iter().any(|v| *v != 0.0),
                    "{qtype:?}: all-zero outputs"
                );
                for backend in Backend::supported() {
                    for pool in &pools {
                        let mut got = vec![0f32; m * n];
                        matmul_quantized_with(backend, &mat, &acts, &mut got, pool)
                            .expect("matmul");
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{backend:?} {qtype:?} n={n} k={k} m={m} threads={}",
                            pool.n_threads()
                        );
                    }
                }
            }
        }
    }
}

/// The batched matmuls of the 32-value formats (`IQ4_NL`, `MXFP4`; on AVX-512 VNNI from two
/// activation rows: 16 weight rows in the lanes, each group decoded once for every activation
/// row) equal, bitwise, each output's lone `vec_dot` on the same backend (the one-row kernels of
/// GGUF rows: the same integer lanes and even / odd float chains), at odd block counts, batch
/// sizes around the widths and row counts that leave a partial group of 16, on one thread and
/// split over two.
#[test]
fn batched_32_value_iq_matmul_is_bitwise_the_row_dots() {
    let mut rng = Rng::new(2915);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let simd: Vec<Backend> = Backend::supported()
        .into_iter()
        .filter(|b| *b != Backend::Scalar)
        .collect();
    eprintln!("32-value IQ formats batched on {simd:?}");
    for qtype in [QType::IQ4_NL, QType::MXFP4] {
        for (n, k) in [(37, 32 * 3), (16, 32), (21, 32 * 16), (18, 32 * 7)] {
            let w = random_raw(&mut rng, qtype, n, k);
            let mat = QMatrix::new(qtype, n, k, &w).expect("matrix");
            let row_bytes = w.len() / n;
            for m in [1, 2, 3, 7, 16, 33] {
                let x = activations(&mut rng, m * k);
                let acts = Activations::quantize(qtype.act_type(), &x, m, k).expect("acts");
                let xq: Vec<Vec<u8>> = (0..m).map(|r| acts.ggml_row(r).expect("row")).collect();
                for &backend in &simd {
                    let want: Vec<u32> = (0..m * n)
                        .map(|i| {
                            let (r, j) = (i / n, i % n);
                            let wr = &w[j * row_bytes..(j + 1) * row_bytes];
                            vec_dot_with(backend, qtype, k, wr, &xq[r]).to_bits()
                        })
                        .collect();
                    assert!(want.iter().any(|&v| v != 0), "{qtype:?}: all-zero outputs");
                    for pool in &pools {
                        let mut got = vec![0f32; m * n];
                        matmul_quantized_with(backend, &mat, &acts, &mut got, pool)
                            .expect("matmul");
                        let bits: Vec<u32> = got.iter().map(|f| f.to_bits()).collect();
                        assert_eq!(
                            bits,
                            want,
                            "{backend:?} {qtype:?} n={n} k={k} m={m} threads={}",
                            pool.n_threads()
                        );
                    }
                }
            }
        }
    }
}
