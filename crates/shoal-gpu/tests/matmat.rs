//! The tiled matrix-matrix kernel (prefill, batches) against the f64 reference, for every weight
//! format (the IQ formats and `MXFP4` included), at batch sizes 1, 2, 5, 16 and 33 and odd numbers
//! of weight rows.
//!
//! Tolerance, as for the matrix-vector kernels: every format is decoded exactly in f32 and the
//! products summed in f32, so each output is within `1e-5 · Σ|w·x| + 1e-6` of the exact product
//! of the same weights.

mod common;

use common::{gpu, gpu_with, matvec_reference, random_matrix, random_vec};
use shoal_gpu::{Gpu, GpuError, MatmatConfig, OpenOptions};
use shoal_kernels::{QMatrix, QType, row_bytes};
use shoal_testkit::rng::SplitMix64;

const BATCHES: [usize; 5] = [1, 2, 5, 16, 33];

/// `(weight rows, cols)` per format: odd rows, and for the plain formats cols not a multiple of 4.
fn shapes(qtype: QType) -> &'static [(usize, usize)] {
    match qtype.block_size() {
        1 => &[(1, 1), (37, 7), (33, 96), (65, 37)],
        32 => &[(1, 32), (37, 96), (65, 544)],
        _ => &[(1, 256), (37, 512), (13, 768)],
    }
}

fn check_matmat(
    gpu: &Gpu,
    qtype: QType,
    (rows, cols): (usize, usize),
    n: usize,
    config: MatmatConfig,
    seed: u64,
) {
    let mut rng = SplitMix64::new(seed);
    let bytes = random_matrix(&mut rng, qtype, rows, cols);
    let w = QMatrix::new(qtype, rows, cols, &bytes).unwrap();
    let x = random_vec(&mut rng, n * cols, -1.0, 1.0);
    let gw = gpu.upload_matrix(&w).unwrap();
    let (gx, gy) = (gpu.upload(&x).unwrap(), gpu.zeros(n * rows).unwrap());
    let mut cmds = gpu.commands();
    cmds.matmat_with(&gw, &gx, &gy, config).unwrap();
    cmds.submit().unwrap();
    let y = gpu.read(&gy).unwrap();
    for (i, (xi, yi)) in x.chunks(cols).zip(y.chunks(rows)).enumerate() {
        let (exact, mag) = matvec_reference(&w, xi);
        for r in 0..rows {
            let err = (f64::from(yi[r]) - exact[r]).abs();
            let tol = 1e-5 * mag[r] + 1e-6;
            assert!(
                err <= tol,
                "{} {rows}×{cols} n={n} {config:?} [{i}][{r}]: gpu {} exact {} (err {err:e} > {tol:e})",
                qtype.name(),
                yi[r],
                exact[r]
            );
        }
    }
}

#[test]
fn matmat_matches_the_cpu_for_every_format_and_batch() {
    let Some(gpu) = gpu() else { return };
    for (q, &qtype) in QType::ALL.iter().enumerate() {
        for (s, &shape) in shapes(qtype).iter().enumerate() {
            for (b, &n) in BATCHES.iter().enumerate() {
                let seed = 1000 * q as u64 + 10 * s as u64 + b as u64;
                check_matmat(&gpu, qtype, shape, n, MatmatConfig::default(), seed);
            }
        }
    }
}

/// The IQ formats and `MXFP4` (not in `QType::ALL`), at the same shapes and batches.
#[test]
fn matmat_matches_the_cpu_for_every_iq_format_and_batch() {
    let Some(gpu) = gpu() else { return };
    for (q, &qtype) in QType::IQ.iter().enumerate() {
        for (s, &shape) in shapes(qtype).iter().enumerate() {
            for (b, &n) in BATCHES.iter().enumerate() {
                let seed = 50_000 + 1000 * q as u64 + 10 * s as u64 + b as u64;
                check_matmat(&gpu, qtype, shape, n, MatmatConfig::default(), seed);
            }
        }
    }
}

/// The tile's override constants change its shape, never its result.
#[test]
fn matmat_is_correct_at_every_tile_shape() {
    let Some(gpu) = gpu() else { return };
    for (weight_rows, x_rows) in [(1, 4), (64, 4), (8, 64), (16, 16), (64, 16), (3, 12)] {
        let config = MatmatConfig {
            weight_rows,
            x_rows,
        };
        for qtype in [
            QType::F16,
            QType::Q4_0,
            QType::Q5_1,
            QType::Q4_K,
            QType::Q6_K,
            QType::Q3_K,
            QType::IQ4_XS,
            QType::IQ2_XXS,
        ] {
            let cols = if qtype.block_size() == 256 { 512 } else { 96 };
            for n in [1, 5, 33] {
                check_matmat(&gpu, qtype, (37, cols), n, config, 77);
            }
        }
    }
}

/// Split matrices (rows in several chunks) write each chunk's columns of Y (vectors stay under
/// the 4 KiB binding: 3 rows of X).
#[test]
fn matmat_over_split_matrices_matches_the_cpu() {
    let Some(gpu) = gpu_with(OpenOptions {
        max_binding: Some(4096),
    }) else {
        return;
    };
    for qtype in [
        QType::F32,
        QType::Q8_0,
        QType::Q4_K,
        QType::Q2_K,
        QType::MXFP4,
        QType::IQ3_S,
    ] {
        for n in [1, 3] {
            check_matmat(&gpu, qtype, (77, 256), n, MatmatConfig::default(), 5);
        }
        let bytes = vec![0u8; row_bytes(qtype, 256) * 77];
        let w = gpu
            .upload_matrix(&QMatrix::new(qtype, 77, 256, &bytes).unwrap())
            .unwrap();
        assert!(w.chunks() > 1, "{}: {} chunk(s)", qtype.name(), w.chunks());
    }
}

#[test]
fn matmat_refuses_bad_tiles_and_shapes() {
    let Some(gpu) = gpu() else { return };
    let bytes = vec![0u8; row_bytes(QType::Q4_0, 64) * 4];
    let w = gpu
        .upload_matrix(&QMatrix::new(QType::Q4_0, 4, 64, &bytes).unwrap())
        .unwrap();
    let (x, y) = (gpu.zeros(128).unwrap(), gpu.zeros(8).unwrap());
    let mut cmds = gpu.commands();
    for (weight_rows, x_rows) in [(0, 4), (65, 4), (32, 6), (32, 0), (64, 64), (32, 68)] {
        let err = cmds.matmat_with(
            &w,
            &x,
            &y,
            MatmatConfig {
                weight_rows,
                x_rows,
            },
        );
        assert!(
            matches!(err, Err(GpuError::Config(_))),
            "{weight_rows}/{x_rows}: {err:?}"
        );
    }
    let (odd, short) = (gpu.zeros(100).unwrap(), gpu.zeros(7).unwrap());
    assert!(matches!(cmds.matmat(&w, &odd, &y), Err(GpuError::Shape(_))));
    assert!(matches!(
        cmds.matmat(&w, &x, &short),
        Err(GpuError::Shape(_))
    ));
    cmds.submit().unwrap();
}
