//! `PackedMatrix`: the 16-row AVX-512 layout (where the CPU has it) and the plain-row layout give
//! the naive reference's results, bitwise independent of the batch and the thread count.

mod common;

use common::{Rng, TYPES, activations, assert_near_reference, fit_k, random_raw, random_weights};
use std::sync::Arc;

use shoal_kernels::{
    Activations, Backend, KernelError, Layout, PackedMatrix, QMatrix, QType, ThreadPool,
};

#[test]
fn layout_follows_the_backend() {
    let mut rng = Rng::new(1);
    for backend in Backend::supported() {
        for qtype in TYPES {
            let k = fit_k(qtype, 64);
            let data = random_weights(&mut rng, qtype, 20, k);
            let w = QMatrix::new(qtype, 20, k, &data).expect("matrix");
            let p = PackedMatrix::with_backend(&w, backend).expect("pack");
            let repacked = matches!(
                qtype,
                QType::Q4_1 | QType::Q8_0 | QType::Q4_K | QType::Q5_K | QType::Q6_K
            );
            let want = if backend == Backend::Avx512Vnni && repacked {
                Layout::Rows16
            } else {
                Layout::Rows
            };
            assert_eq!(p.layout(), want, "{backend:?} {qtype:?}");
            assert_eq!(p.backend(), backend);
            assert_eq!((p.rows(), p.cols(), p.qtype()), (20, k, qtype));
            if backend == Backend::detect() {
                let owned = PackedMatrix::from_rows(qtype, 20, k, data.clone()).expect("pack");
                assert_eq!((owned.layout(), owned.bytes()), (p.layout(), p.bytes()));
            }
            // Repacking keeps the bytes, plus the padding of the last group of 16 rows.
            let padded = if want == Layout::Rows16 { 32 } else { 20 };
            assert_eq!(p.bytes(), data.len() / 20 * padded, "{backend:?} {qtype:?}");
        }
    }
}

/// `Q4_K`, `Q5_K` and `Q6_K` in 16-row groups (the AVX-512 VNNI layout) give bitwise the outputs of
/// their GGUF rows on the other SIMD backends (AVX2, AVX-VNNI): the same exact integers per
/// super-block (per lane of eight for `Q6_K`) and the same float steps (the scalar reference, which
/// sums in another order, is checked within rounding by the test below). Odd row counts (a padded last group), one to nine activation rows
/// (tiles of 4 and their remainders).
#[test]
fn k_quant_groups_are_bitwise_equal_to_rows_on_every_backend() {
    let mut rng = Rng::new(4242);
    let pool = ThreadPool::new(2);
    let backends: Vec<Backend> = Backend::supported()
        .into_iter()
        .filter(|b| *b != Backend::Scalar)
        .collect();
    eprintln!("Q4_K, Q5_K, Q6_K compared on {backends:?}");
    let cases = [(16, 256), (37, 512), (40, 1024)];
    for (qtype, (n, k)) in [QType::Q4_K, QType::Q5_K, QType::Q6_K]
        .into_iter()
        .flat_map(|q| cases.map(|c| (q, c)))
    {
        let data = random_raw(&mut rng, qtype, n, k);
        let w = QMatrix::new(qtype, n, k, &data).expect("matrix");
        for m in [1, 2, 3, 4, 5, 9] {
            let x = activations(&mut rng, m * k);
            let outs: Vec<Vec<u32>> = backends
                .iter()
                .map(|&b| {
                    let p = PackedMatrix::with_backend(&w, b).expect("pack");
                    let mut out = vec![f32::NAN; m * n];
                    p.matmul(&x, m, &mut out, &pool).expect("matmul");
                    out.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            for (b, o) in backends.iter().zip(&outs) {
                let first = backends[0];
                assert_eq!(
                    o, &outs[0],
                    "{qtype:?} n={n} k={k} m={m}: {b:?} vs {first:?}"
                );
            }
        }
    }
}

#[test]
fn packed_matmul_matches_naive_reference_on_every_backend() {
    let mut rng = Rng::new(77);
    let pool = ThreadPool::new(2);
    for backend in Backend::supported() {
        for qtype in TYPES {
            for (n, k) in [(16, 32), (40, 96), (300, 576), (19, 1536)] {
                let k = fit_k(qtype, k);
                for m in [1, 7, 8, 9, 17] {
                    let data = if m == 7 {
                        random_raw(&mut rng, qtype, n, k) // every quant bit pattern, -128 included
                    } else {
                        random_weights(&mut rng, qtype, n, k)
                    };
                    let w = QMatrix::new(qtype, n, k, &data).expect("matrix");
                    let p = PackedMatrix::with_backend(&w, backend).expect("pack");
                    let x = activations(&mut rng, m * k);
                    let mut out = vec![f32::NAN; m * n];
                    p.matmul(&x, m, &mut out, &pool).expect("matmul");
                    let label = format!("{backend:?} {qtype:?}");
                    assert_near_reference(&label, qtype, &data, n, k, &x, &out);
                }
            }
        }
    }
}

/// A row's outputs do not depend on how many rows share the call, where the row sits among them,
/// or how many threads run it: batched decoding gives each sequence its lone-run logits.
#[test]
fn packed_results_are_bitwise_independent_of_batch_and_threads() {
    let mut rng = Rng::new(5);
    let pools: Vec<ThreadPool> = [1, 2, 3].into_iter().map(ThreadPool::new).collect();
    for backend in Backend::supported() {
        for qtype in TYPES {
            let (n, k, m) = (72, fit_k(qtype, 192), 19);
            let data = random_raw(&mut rng, qtype, n, k);
            let w = QMatrix::new(qtype, n, k, &data).expect("matrix");
            let p = PackedMatrix::with_backend(&w, backend).expect("pack");
            let x = activations(&mut rng, m * k);
            let mut all = vec![0f32; m * n];
            p.matmul(&x, m, &mut all, &pools[1]).expect("matmul");
            for r in 0..m {
                let mut one = vec![0f32; n];
                p.matmul(&x[r * k..(r + 1) * k], 1, &mut one, &pools[r % 3])
                    .expect("matmul");
                let same = one
                    .iter()
                    .zip(&all[r * n..(r + 1) * n])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{backend:?} {qtype:?}: row {r} alone differs");
            }
            for pool in [&pools[0], &pools[2]] {
                let mut out = vec![0f32; m * n];
                p.matmul(&x, m, &mut out, pool).expect("matmul");
                assert!(
                    out.iter()
                        .zip(&all)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{backend:?} {qtype:?}: {} threads differ",
                    pool.n_threads()
                );
            }
        }
    }
}

#[test]
fn packed_matmul_rejects_mismatched_operands() {
    let mut rng = Rng::new(3);
    let pool = ThreadPool::new(1);
    let data = random_weights(&mut rng, QType::Q4_1, 16, 64);
    let w = QMatrix::new(QType::Q4_1, 16, 64, &data).expect("matrix");
    let p = PackedMatrix::new(&w).expect("pack");
    let x = activations(&mut rng, 2 * 64);
    let mut short = vec![0f32; 16];
    assert!(
        p.matmul(&x, 2, &mut short, &pool).is_err(),
        "output too short"
    );
    let mut out = vec![0f32; 32];
    assert!(
        p.matmul(&x[..100], 2, &mut out, &pool).is_err(),
        "input too short"
    );
    let wrong = Activations::quantize(QType::Q8_0.act_type(), &x, 2, 64).expect("acts");
    assert!(
        p.matmul_quantized(&wrong, &mut out, &pool).is_err(),
        "wrong activation format"
    );
}

/// Every row of every format reads back from the packed matrix, whatever its layout, as the
/// GGUF row decodes; a row index past the end or a short output is an error.
#[test]
fn packed_rows_dequantize_as_the_gguf_rows() {
    let mut rng = Rng::new(6);
    for backend in Backend::supported() {
        for qtype in TYPES {
            let (n, k) = (37, fit_k(qtype, 96));
            let data = random_raw(&mut rng, qtype, n, k);
            let w = QMatrix::new(qtype, n, k, &data).expect("matrix");
            let p = PackedMatrix::with_backend(&w, backend).expect("pack");
            let (mut want, mut got) = (vec![0f32; k], vec![0f32; k]);
            for i in 0..n {
                w.dequantize_row(i, &mut want).expect("row");
                p.dequantize_row(i, &mut got).expect("packed row");
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{backend:?} {qtype:?} row {i}"
                );
            }
            assert!(matches!(
                p.dequantize_row(n, &mut got),
                Err(KernelError::BadSliceLength { .. })
            ));
            assert!(p.dequantize_row(0, &mut got[..k - 1]).is_err());
        }
    }
}

/// Bytes handed over in an `Arc` are the matrix's own where the layout is rows (one copy for a
/// tied embedding and head), and multiply as an owned copy does.
#[test]
fn shared_rows_are_not_copied() {
    let mut rng = Rng::new(8);
    let pool = ThreadPool::new(1);
    for qtype in TYPES {
        let (n, k, m) = (24, fit_k(qtype, 64), 3);
        let bytes = Arc::new(random_weights(&mut rng, qtype, n, k));
        let shared =
            PackedMatrix::from_shared_rows(qtype, n, k, Arc::clone(&bytes)).expect("shared");
        let owned = PackedMatrix::from_rows(qtype, n, k, bytes.to_vec()).expect("owned");
        let users = if shared.layout() == Layout::Rows {
            2
        } else {
            1
        };
        assert_eq!(Arc::strong_count(&bytes), users, "{qtype:?}");
        // A clone shares the matrix's bytes.
        let clone = shared.clone();
        assert_eq!(Arc::strong_count(&bytes), 2 * users - 1, "{qtype:?}");
        drop(clone);
        let x = activations(&mut rng, m * k);
        let (mut a, mut b) = (vec![0f32; m * n], vec![0f32; m * n]);
        shared.matmul(&x, m, &mut a, &pool).expect("shared");
        owned.matmul(&x, m, &mut b, &pool).expect("owned");
        assert_eq!(a, b, "{qtype:?}");
        assert!(PackedMatrix::from_shared_rows(qtype, n + 1, k, bytes).is_err());
    }
}
