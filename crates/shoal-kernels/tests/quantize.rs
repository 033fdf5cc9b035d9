//! Quantization round trips, formats and malformed input at the API boundary.

mod common;

use common::{Rng, activations};
use shoal_kernels::{
    ActType, KernelError, QK, QType, dequantize_row, quantize_row_q4_1, quantize_row_q8_0,
    quantize_row_q8_1, row_bytes, scalar,
};

#[test]
fn block_layouts_match_ggml() {
    assert_eq!(
        (QType::Q4_1.block_size(), QType::Q4_1.type_size()),
        (32, 20)
    );
    assert_eq!(
        (QType::Q8_0.block_size(), QType::Q8_0.type_size()),
        (32, 34)
    );
    assert_eq!((QType::F32.block_size(), QType::F32.type_size()), (1, 4));
    assert_eq!(
        (ActType::Q8_1.block_size(), ActType::Q8_1.type_size()),
        (32, 36)
    );
    assert_eq!(row_bytes(QType::Q4_1, 576), 18 * 20);
    assert_eq!(row_bytes(QType::Q8_0, 576), 18 * 34);
    assert_eq!(row_bytes(QType::F32, 5), 20);
    for t in QType::ALL {
        assert_eq!(QType::from_ggml_type_id(t.ggml_type_id()), Some(t));
    }
    assert_eq!(QType::from_ggml_type_id(4), None);
}

/// Max error per block: Q8 ≤ d/2 (+ f16 rounding of d), Q4_1 ≤ d/2 (+ f16 rounding of d, m).
#[test]
fn roundtrip_error_is_within_half_a_step() {
    let mut rng = Rng::new(5);
    for k in [32, 96, 576] {
        let x = activations(&mut rng, k);
        let mut q8 = vec![0u8; k / QK * 34];
        quantize_row_q8_0(&x, &mut q8).expect("q8_0");
        let mut y = vec![0f32; k];
        dequantize_row(QType::Q8_0, &q8, &mut y).expect("decode");
        for (b, (xb, yb)) in x.chunks(QK).zip(y.chunks(QK)).enumerate() {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let tol = amax / 127.0 * 0.5 + amax * 1e-3;
            for (a, c) in xb.iter().zip(yb) {
                assert!(
                    (a - c).abs() <= tol,
                    "Q8_0 block {b}: {a} → {c} (tol {tol})"
                );
            }
        }

        let mut q81 = vec![0u8; k / QK * 36];
        quantize_row_q8_1(&x, &mut q81).expect("q8_1");
        scalar::dequantize_row_q8_1(&q81, &mut y);
        for (b, (xb, (yb, blk))) in x
            .chunks(QK)
            .zip(y.chunks(QK).zip(q81.chunks(36)))
            .enumerate()
        {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let tol = amax / 127.0 * 0.5 + amax * 1e-3;
            for (a, c) in xb.iter().zip(yb) {
                assert!((a - c).abs() <= tol, "Q8_1 block {b}: {a} → {c}");
            }
            // s = d · Σq, to f16 precision.
            let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            let s = half::f16::from_le_bytes([blk[2], blk[3]]).to_f32();
            let sum: i32 = blk[4..].iter().map(|&q| i32::from(q as i8)).sum();
            let want = sum as f32 * d;
            assert!(
                (s - want).abs() <= want.abs() * 1e-3 + 1e-6,
                "Q8_1 s {s} vs {want}"
            );
        }

        let mut q4 = vec![0u8; k / QK * 20];
        quantize_row_q4_1(&x, &mut q4).expect("q4_1");
        dequantize_row(QType::Q4_1, &q4, &mut y).expect("decode");
        for (b, (xb, yb)) in x.chunks(QK).zip(y.chunks(QK)).enumerate() {
            let (lo, hi) = xb
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            let tol = (hi - lo) / 15.0 * 0.5 + (hi.abs() + lo.abs()) * 2e-3;
            for (a, c) in xb.iter().zip(yb) {
                assert!(
                    (a - c).abs() <= tol,
                    "Q4_1 block {b}: {a} → {c} (tol {tol})"
                );
            }
        }
    }
}

#[test]
fn constant_and_zero_blocks_roundtrip_exactly() {
    let x = vec![0.0f32; 64];
    let mut q = vec![0u8; 68];
    quantize_row_q8_0(&x, &mut q).expect("q8_0");
    let mut y = vec![1f32; 64];
    dequantize_row(QType::Q8_0, &q, &mut y).expect("decode");
    assert!(y.iter().all(|&v| v == 0.0));

    let x = vec![0.25f32; 32];
    let mut q = vec![0u8; 20];
    quantize_row_q4_1(&x, &mut q).expect("q4_1");
    let mut y = vec![0f32; 32];
    dequantize_row(QType::Q4_1, &q, &mut y).expect("decode");
    assert!(y.iter().all(|&v| v == 0.25), "{y:?}");
}

#[test]
fn f32_rows_roundtrip() {
    let x = [1.5f32, -2.0, 3.25];
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut y = [0f32; 3];
    dequantize_row(QType::F32, &bytes, &mut y).expect("decode");
    assert_eq!(x, y);
}

#[test]
fn malformed_rows_are_errors() {
    let x = vec![0.5f32; 40];
    let mut out = vec![0u8; 45];
    assert!(matches!(
        quantize_row_q8_1(&x, &mut out),
        Err(KernelError::BadRowLength { k: 40, .. })
    ));
    let x = vec![0.5f32; 64];
    let mut out = vec![0u8; 71];
    let e = quantize_row_q8_1(&x, &mut out).unwrap_err();
    assert_eq!(
        e,
        KernelError::BadSliceLength {
            what: "Q8_1 output (bytes)",
            expected: 72,
            actual: 71
        }
    );
    assert!(e.to_string().contains("expected 72"), "{e}");
    assert!(quantize_row_q8_0(&x, &mut out).is_err());
    assert!(quantize_row_q4_1(&x, &mut out).is_err());
    let mut y = vec![0f32; 64];
    assert!(dequantize_row(QType::Q4_1, &[0u8; 39], &mut y).is_err());
    let mut y = vec![0f32; 33];
    assert!(matches!(
        dequantize_row(QType::Q8_0, &[0u8; 68], &mut y),
        Err(KernelError::BadRowLength { .. })
    ));
    assert!(QType::Q4_1.try_row_bytes(33).is_err());
}

#[test]
#[should_panic(expected = "not a multiple of the Q4_1 block size")]
fn row_bytes_panics_with_a_clear_message() {
    row_bytes(QType::Q4_1, 33);
}

#[test]
#[should_panic(expected = "shoal_kernels::vec_dot")]
fn vec_dot_rejects_short_rows() {
    shoal_kernels::vec_dot(QType::Q4_1, 64, &[0u8; 40], &[0u8; 71]);
}

#[test]
#[should_panic(expected = "not a multiple")]
fn vec_dot_rejects_partial_blocks() {
    shoal_kernels::vec_dot(QType::Q8_0, 48, &[0u8; 34], &[0u8; 34]);
}
