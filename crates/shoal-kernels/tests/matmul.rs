//! `matmul` against naive references, across thread counts, backends and odd shapes.

mod common;

use common::{
    Rng, TYPES, activations, assert_near_reference, decode, dequantize_acts, fit_k, has_encoder,
    random_raw, random_weights, reference,
};
use shoal_kernels::{
    ActType, Activations, Backend, KernelError, QMatrix, QType, RayonCurrent, ThreadPool, matmul,
    matmul_quantized, matmul_quantized_with, scalar, vec_dot_with,
};

#[test]
fn matmul_matches_naive_reference() {
    let mut rng = Rng::new(42);
    let pool = ThreadPool::new(2);
    for qtype in TYPES {
        for (n, k) in [(1, 32), (5, 64), (37, 96), (300, 576), (19, 1536)] {
            let k = fit_k(qtype, k);
            for m in [1, 3, 17, 40] {
                let data = random_weights(&mut rng, qtype, n, k);
                let w = QMatrix::new(qtype, n, k, &data).expect("matrix");
                let x = activations(&mut rng, m * k);
                let mut out = vec![f32::NAN; m * n];
                matmul(&w, &x, m, &mut out, &pool).expect("matmul");

                let wf = assert_near_reference(&format!("{qtype:?}"), qtype, &data, n, k, &x, &out);

                // Against unquantized activations: the error of Q8 activation quantization.
                let (exact, mag) = reference(&wf, &x, m, n, k);
                let err: f64 = out
                    .iter()
                    .zip(&exact)
                    .map(|(a, b)| f64::from(a - b).powi(2))
                    .sum::<f64>()
                    .sqrt();
                // Random blocks (formats the tests cannot encode) are symmetric, so a small
                // product may cancel to near zero: judge those against Σ|w·x| instead.
                let scale = if has_encoder(qtype) { &exact } else { &mag };
                let norm: f64 = scale
                    .iter()
                    .map(|&b| f64::from(b).powi(2))
                    .sum::<f64>()
                    .sqrt();
                // Q8_K scales 256 values at once, so an outlier coarsens more of its neighbours.
                let bound = match qtype.act_type() {
                    ActType::F32 => 1e-5,
                    ActType::Q8_K => 6e-2,
                    _ => 2e-2,
                };
                assert!(
                    err <= bound * norm + 1e-6,
                    "{qtype:?} m={m} n={n} k={k}: rel err {}",
                    err / norm
                );
            }
        }
    }
}

#[test]
fn results_are_bitwise_independent_of_thread_count() {
    let mut rng = Rng::new(9);
    let pools: Vec<ThreadPool> = [1, 2, 3, 4].into_iter().map(ThreadPool::new).collect();
    for qtype in TYPES {
        for (n, m) in [(1000, 1), (333, 17), (49, 5)] {
            let k = fit_k(qtype, 192);
            let data = random_weights(&mut rng, qtype, n, k);
            let w = QMatrix {
                qtype,
                rows: n,
                cols: k,
                data: &data,
            };
            let x = activations(&mut rng, m * k);
            let mut first = vec![0f32; m * n];
            matmul(&w, &x, m, &mut first, &pools[0]).expect("matmul");
            for pool in &pools[1..] {
                let mut out = vec![0f32; m * n];
                matmul(&w, &x, m, &mut out, pool).expect("matmul");
                assert!(
                    first
                        .iter()
                        .zip(&out)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{qtype:?} n={n} m={m}: {} threads differ from 1",
                    pool.n_threads()
                );
            }
            let rayon_pool = rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .expect("rayon");
            let mut out = vec![0f32; m * n];
            rayon_pool
                .install(|| matmul(&w, &x, m, &mut out, &RayonCurrent))
                .expect("matmul");
            assert!(
                first
                    .iter()
                    .zip(&out)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "rayon differs"
            );
        }
    }
}

/// Grouping activation rows four at a time must not change any output bit: every output equals
/// the single-row `vec_dot` of the same backend.
#[test]
fn batched_rows_equal_single_row_dots_bitwise() {
    let mut rng = Rng::new(21);
    let pool = ThreadPool::new(2);
    for backend in Backend::supported() {
        for qtype in TYPES {
            let (n, k, m) = (23, fit_k(qtype, 320), 39);
            let data = random_raw(&mut rng, qtype, n, k);
            let w = QMatrix::new(qtype, n, k, &data).expect("matrix");
            let x = activations(&mut rng, m * k);
            let acts = Activations::quantize(qtype.act_type(), &x, m, k).expect("acts");
            let mut out = vec![0f32; m * n];
            matmul_quantized_with(backend, &w, &acts, &mut out, &pool).expect("matmul");
            for r in 0..m {
                let xr = acts.ggml_row(r).expect("row");
                for j in 0..n {
                    let want = vec_dot_with(backend, qtype, k, w.row(j).expect("row"), &xr);
                    assert_eq!(
                        out[r * n + j].to_bits(),
                        want.to_bits(),
                        "{backend:?} {qtype:?} ({r}, {j})"
                    );
                }
            }
        }
    }
}

#[test]
fn simd_matmul_matches_scalar_matmul() {
    let mut rng = Rng::new(33);
    let pool = ThreadPool::new(2);
    for qtype in TYPES {
        let (n, k, m) = (130, fit_k(qtype, 576), 17);
        let data = random_weights(&mut rng, qtype, n, k);
        let w = QMatrix::new(qtype, n, k, &data).expect("matrix");
        let x = activations(&mut rng, m * k);
        let acts = Activations::quantize(qtype.act_type(), &x, m, k).expect("acts");
        let mut want = vec![0f32; m * n];
        matmul_quantized_with(Backend::Scalar, &w, &acts, &mut want, &pool).expect("scalar");
        for backend in Backend::supported() {
            let mut out = vec![0f32; m * n];
            matmul_quantized_with(backend, &w, &acts, &mut out, &pool).expect("simd");
            let wf = decode(qtype, &data, n, k);
            let xf = dequantize_acts(&acts, m, k);
            let (_, mag) = reference(&wf, &xf, m, n, k);
            for i in 0..m * n {
                assert!(
                    (out[i] - want[i]).abs() <= 2e-6 * mag[i] + 1e-6,
                    "{backend:?} {qtype:?} [{i}]"
                );
            }
        }
    }
}

#[test]
fn quantized_activations_can_be_reused_and_requantized() {
    let mut rng = Rng::new(4);
    let pool = ThreadPool::new(2);
    let (n, k) = (64, 128);
    let data = random_weights(&mut rng, QType::Q4_1, n, k);
    let w = QMatrix::new(QType::Q4_1, n, k, &data).expect("matrix");
    let mut acts = Activations::default();
    // 37 rows take the parallel quantization path (≥ 8 rows per thread).
    for m in [3, 1, 9, 37] {
        let x = activations(&mut rng, m * k);
        acts.quantize_into_par(ActType::Q8_1, &x, m, k, &pool)
            .expect("quantize");
        assert_eq!((acts.m(), acts.k()), (m, k));
        let mut a = vec![0f32; m * n];
        matmul_quantized(&w, &acts, &mut a, &pool).expect("matmul");
        let mut b = vec![0f32; m * n];
        matmul(&w, &x, m, &mut b, &pool).expect("matmul");
        assert_eq!(a, b);
        let serial = Activations::quantize(ActType::Q8_1, &x, m, k).expect("quantize");
        for r in 0..m {
            assert_eq!(serial.ggml_row(r), acts.ggml_row(r));
            // The packed layout holds exactly ggml's Q8_1 blocks.
            let mut want = vec![0u8; k / 32 * 36];
            scalar::quantize_row_q8_1(&x[r * k..(r + 1) * k], &mut want);
            assert_eq!(acts.ggml_row(r).expect("row"), want);
        }
    }
}

#[test]
fn empty_shapes_are_fine() {
    let pool = ThreadPool::new(2);
    let w = QMatrix::new(QType::Q8_0, 0, 64, &[]).expect("matrix");
    let mut out = vec![];
    matmul(&w, &[0.0; 128], 2, &mut out, &pool).expect("n = 0");
    let data = vec![0u8; 3 * 68];
    let w = QMatrix::new(QType::Q8_0, 3, 64, &data).expect("matrix");
    matmul(&w, &[], 0, &mut out, &pool).expect("m = 0");
    for qtype in TYPES {
        let w = QMatrix::new(qtype, 3, 0, &[]).expect("k = 0");
        let mut out = vec![f32::NAN; 6];
        matmul(&w, &[], 2, &mut out, &pool).expect("k = 0");
        assert_eq!(out, vec![0.0; 6]);
    }
}

#[test]
fn malformed_matmul_arguments_are_errors() {
    let pool = ThreadPool::new(1);
    let data = vec![0u8; 4 * 40];
    let x = vec![0f32; 2 * 64];
    let mut out = vec![0f32; 2 * 4];
    // k not a multiple of 32.
    let w = QMatrix {
        qtype: QType::Q4_1,
        rows: 4,
        cols: 63,
        data: &data,
    };
    assert!(matches!(
        matmul(&w, &x, 2, &mut out, &pool),
        Err(KernelError::BadRowLength { k: 63, .. })
    ));
    // Weight bytes do not match the shape.
    let w = QMatrix {
        qtype: QType::Q4_1,
        rows: 5,
        cols: 64,
        data: &data,
    };
    assert!(matches!(
        matmul(&w, &x, 2, &mut out, &pool),
        Err(KernelError::BadSliceLength { .. })
    ));
    assert!(QMatrix::new(QType::Q4_1, 5, 64, &data).is_err());
    let w = QMatrix::new(QType::Q4_1, 4, 64, &data).expect("matrix");
    // Activations too short, output too short.
    assert!(matmul(&w, &x[..100], 2, &mut out, &pool).is_err());
    assert!(matmul(&w, &x, 2, &mut out[..7], &pool).is_err());
    // Activations in the wrong format or of the wrong width.
    let acts = Activations::quantize(ActType::Q8_0, &x, 2, 64).expect("acts");
    let e = matmul_quantized(&w, &acts, &mut out, &pool).unwrap_err();
    assert!(matches!(e, KernelError::FormatMismatch { .. }), "{e}");
    assert!(matmul_quantized(&w, &Activations::default(), &mut out, &pool).is_err());
    let acts = Activations::quantize(ActType::Q8_1, &x, 4, 32).expect("acts");
    assert!(matmul_quantized(&w, &acts, &mut out, &pool).is_err());
    // Overflowing shapes.
    let w = QMatrix {
        qtype: QType::Q8_0,
        rows: usize::MAX / 2,
        cols: 64,
        data: &data,
    };
    assert!(matches!(
        matmul(&w, &x, 2, &mut out, &pool),
        Err(KernelError::Overflow { .. })
    ));
    assert!(w.row(0).is_err());
}

#[test]
fn embedding_rows_dequantize_from_the_matrix() {
    let mut rng = Rng::new(8);
    let (n, k) = (10, 64);
    let data = random_weights(&mut rng, QType::Q8_0, n, k);
    let w = QMatrix::new(QType::Q8_0, n, k, &data).expect("matrix");
    let all = decode(QType::Q8_0, &data, n, k);
    let mut row = vec![0f32; k];
    w.dequantize_row(7, &mut row).expect("row 7");
    assert_eq!(row, all[7 * k..8 * k]);
    assert!(w.dequantize_row(10, &mut row).is_err());
}

#[test]
fn activations_report_their_shape_and_reject_bad_rows() {
    let x = vec![0.25f32; 5 * 64];
    let acts = Activations::quantize(ActType::Q8_0, &x, 5, 64).expect("acts");
    assert_eq!(
        (acts.act_type(), acts.m(), acts.k()),
        (Some(ActType::Q8_0), 5, 64)
    );
    assert_eq!(acts.ggml_row(4).expect("row").len(), 68);
    assert!(acts.ggml_row(5).is_err());
    assert!(Activations::default().ggml_row(0).is_err());
    assert!(Activations::quantize(ActType::Q8_1, &x, 5, 60).is_err());
    assert!(Activations::quantize(ActType::Q8_1, &x, 6, 64).is_err());
    let f = Activations::quantize(ActType::F32, &x[..15], 3, 5).expect("f32 acts");
    assert_eq!(f.ggml_row(2).expect("row"), 0.25f32.to_le_bytes().repeat(5));
}
