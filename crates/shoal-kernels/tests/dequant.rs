//! Every dequantizer (the IQ formats and `MXFP4` included) against the `gguf` Python package's
//! reference dequantization of the same bytes (fixtures written by
//! `scripts/fixtures/dequant_reference.py`), and the K-quants' row length rule at the public
//! boundary.

mod common;

use common::{Rng, activations, random_raw};
use shoal_kernels::{
    ActType, Activations, KernelError, PackedMatrix, QMatrix, QType, ThreadPool, dequantize_row,
    matmul, quantize_row_q8_k, scalar,
};

/// Values per fixture (4 super-blocks of a K-quant, 32 blocks of the others), and per fixture of
/// the IQ formats and `MXFP4` (8 super-blocks, 64 blocks of 32).
const N: usize = 1024;
const N_IQ: usize = 2048;

macro_rules! fixture {
    ($name:literal) => {
        (
            include_bytes!(concat!("fixtures/dequant/", $name, ".blocks")).as_slice(),
            include_bytes!(concat!("fixtures/dequant/", $name, ".f32")).as_slice(),
        )
    };
}

fn fixture(qtype: QType) -> (&'static [u8], &'static [u8]) {
    match qtype {
        QType::F16 => fixture!("F16"),
        QType::BF16 => fixture!("BF16"),
        QType::Q4_0 => fixture!("Q4_0"),
        QType::Q4_1 => fixture!("Q4_1"),
        QType::Q5_0 => fixture!("Q5_0"),
        QType::Q5_1 => fixture!("Q5_1"),
        QType::Q8_0 => fixture!("Q8_0"),
        QType::Q2_K => fixture!("Q2_K"),
        QType::Q3_K => fixture!("Q3_K"),
        QType::Q4_K => fixture!("Q4_K"),
        QType::Q5_K => fixture!("Q5_K"),
        QType::Q6_K => fixture!("Q6_K"),
        QType::IQ4_NL => fixture!("IQ4_NL"),
        QType::MXFP4 => fixture!("MXFP4"),
        QType::IQ4_XS => fixture!("IQ4_XS"),
        QType::IQ3_S => fixture!("IQ3_S"),
        QType::IQ3_XXS => fixture!("IQ3_XXS"),
        QType::IQ2_XXS => fixture!("IQ2_XXS"),
        QType::IQ2_XS => fixture!("IQ2_XS"),
        QType::IQ2_S => fixture!("IQ2_S"),
        QType::IQ1_S => fixture!("IQ1_S"),
        QType::IQ1_M => fixture!("IQ1_M"),
        QType::F32 => unreachable!("F32 has no fixture"),
    }
}

/// Bitwise: the same f32 operations in the same order as ggml and the `gguf` package (no fused
/// multiply-add on either side), so even the sign of zero agrees.
#[test]
fn every_dequantizer_matches_the_gguf_package_bitwise() {
    let types = QType::ALL.into_iter().chain(QType::IQ);
    for qtype in types.filter(|&t| t != QType::F32) {
        let n = if qtype.is_iq() { N_IQ } else { N };
        let (blocks, values) = fixture(qtype);
        let want: Vec<f32> = values
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(want.len(), n, "{qtype:?} fixture size");
        let mut got = vec![f32::NAN; n];
        dequantize_row(qtype, blocks, &mut got).expect("decode");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{qtype:?} value {i}: {g} vs {w}");
        }
        // The same bytes as a 4-row matrix: each row decodes to its quarter.
        let rows = 4;
        let w = QMatrix::new(qtype, rows, n / rows, blocks).expect("matrix");
        let p = PackedMatrix::new(&w).expect("packed");
        let mut row = vec![0f32; n / rows];
        for r in 0..rows {
            let quarter = &want[r * n / rows..(r + 1) * n / rows];
            w.dequantize_row(r, &mut row).expect("row");
            assert_eq!(row, quarter, "{qtype:?} row {r}");
            p.dequantize_row(r, &mut row).expect("packed row");
            assert_eq!(row, quarter, "{qtype:?} packed row {r}");
        }
        // Each fixture exercises its format (not all zeros).
        assert!(
            want.iter().any(|v| *v != 0.0),
            "{qtype:?} fixture is all zeros"
        );
    }
}

#[test]
fn block_sizes_and_ids_are_ggmls() {
    let table = [
        (QType::F32, 0, 1, 4),
        (QType::F16, 1, 1, 2),
        (QType::Q4_0, 2, 32, 18),
        (QType::Q4_1, 3, 32, 20),
        (QType::Q5_0, 6, 32, 22),
        (QType::Q5_1, 7, 32, 24),
        (QType::Q8_0, 8, 32, 34),
        (QType::Q2_K, 10, 256, 84),
        (QType::Q3_K, 11, 256, 110),
        (QType::Q4_K, 12, 256, 144),
        (QType::Q5_K, 13, 256, 176),
        (QType::Q6_K, 14, 256, 210),
        (QType::BF16, 30, 1, 2),
        (QType::IQ2_XXS, 16, 256, 66),
        (QType::IQ2_XS, 17, 256, 74),
        (QType::IQ3_XXS, 18, 256, 98),
        (QType::IQ1_S, 19, 256, 50),
        (QType::IQ4_NL, 20, 32, 18),
        (QType::IQ3_S, 21, 256, 110),
        (QType::IQ2_S, 22, 256, 82),
        (QType::IQ4_XS, 23, 256, 136),
        (QType::IQ1_M, 29, 256, 56),
        (QType::MXFP4, 39, 32, 17),
    ];
    for (qtype, id, block, size) in table {
        assert_eq!(qtype.ggml_type_id(), id, "{qtype:?}");
        assert_eq!(QType::from_ggml_type_id(id), Some(qtype));
        assert_eq!((qtype.block_size(), qtype.type_size()), (block, size));
        assert_eq!(qtype.name(), format!("{qtype:?}"));
        assert_eq!(qtype.is_k_quant(), block == 256);
        assert_eq!(qtype.is_iq(), QType::IQ.contains(&qtype), "{qtype:?}");
        assert_eq!(qtype.is_iq(), id >= 16 && id != 30, "{qtype:?}");
    }
    assert_eq!(QType::ALL.len() + QType::IQ.len(), table.len());
    for id in [4, 5, 9, 15, 24, 31, 40, u32::MAX] {
        assert_eq!(QType::from_ggml_type_id(id), None, "id {id}");
    }
    assert_eq!(
        (ActType::Q8_K.block_size(), ActType::Q8_K.type_size()),
        (256, 292)
    );
}

/// K-quant rows must hold whole 256-value super-blocks: every checked entry point says so with
/// a `KernelError` naming the format.
#[test]
fn k_quant_rows_must_be_multiples_of_256() {
    let pool = ThreadPool::new(1);
    for qtype in QType::ALL.into_iter().filter(|t| t.is_k_quant()) {
        let e = qtype.try_row_bytes(640).unwrap_err();
        assert_eq!(
            e,
            KernelError::BadRowLength {
                format: qtype.name(),
                k: 640,
                block: 256
            }
        );
        assert!(
            e.to_string().contains(&format!(
                "not a multiple of the {} block size 256",
                qtype.name()
            )),
            "{e}"
        );
        let data = vec![0u8; 2 * qtype.type_size() * 2];
        assert!(QMatrix::new(qtype, 2, 640, &data).is_err());
        assert!(PackedMatrix::from_rows(qtype, 2, 640, data.clone()).is_err());
        let w = QMatrix {
            qtype,
            rows: 2,
            cols: 640,
            data: &data,
        };
        let mut out = vec![0f32; 2];
        assert!(matches!(
            matmul(&w, &[0.0; 640], 1, &mut out, &pool),
            Err(KernelError::BadRowLength { k: 640, .. })
        ));
        let mut y = vec![0f32; 640];
        assert!(dequantize_row(qtype, &data, &mut y).is_err());
        // Whole super-blocks but the wrong byte count.
        let mut y = vec![0f32; 256];
        assert!(matches!(
            dequantize_row(qtype, &data[..qtype.type_size() - 1], &mut y),
            Err(KernelError::BadSliceLength { .. })
        ));
    }
    assert!(Activations::quantize(ActType::Q8_K, &[0.0; 640], 1, 640).is_err());
    let mut out = vec![0u8; 292];
    assert!(quantize_row_q8_k(&[0.0; 200], &mut out).is_err());
    assert!(quantize_row_q8_k(&[0.0; 256], &mut out[..291]).is_err());
}

/// `Q8_K` activations are ggml's: the first value of largest magnitude maps to -127, `d` is
/// exactly `-max / 127`'s f32 inverse, and the 16 sums add the quants of each 16 values.
#[test]
fn q8_k_activations_follow_ggml() {
    let mut rng = Rng::new(12);
    let mut x = activations(&mut rng, 512);
    x[300] = -90.0; // the largest magnitude of block 1, negative
    x[301] = 90.0; // as large, later: not the pick
    x[..256].iter_mut().for_each(|v| *v = 0.0);
    let mut q = vec![0u8; 2 * 292];
    scalar::quantize_row_q8_k(&x, &mut q);
    let mut public = vec![0u8; 2 * 292];
    quantize_row_q8_k(&x, &mut public).expect("q8_k");
    assert_eq!(
        q, public,
        "the detected backend quantizes bitwise as the reference"
    );
    assert!(
        q[..292].iter().all(|&b| b == 0),
        "a zero block is all zeros"
    );
    let b1 = &q[292..];
    let d = f32::from_le_bytes([b1[0], b1[1], b1[2], b1[3]]);
    assert_eq!(d, 1.0 / (-127.0f32 / -90.0));
    assert_eq!((b1[4 + 44] as i8, b1[4 + 45] as i8), (-127, 127));
    for g in 0..16 {
        let sum: i32 = b1[4 + 16 * g..4 + 16 * (g + 1)]
            .iter()
            .map(|&v| i32::from(v as i8))
            .sum();
        let at = 4 + 256 + 2 * g;
        assert_eq!(i32::from(i16::from_le_bytes([b1[at], b1[at + 1]])), sum);
    }
    // Dequantized, each value is within half a step of the input.
    let mut y = vec![0f32; 512];
    scalar::dequantize_row_q8_k(&q, &mut y);
    for (a, b) in x.iter().zip(&y) {
        assert!((a - b).abs() <= d.abs() * 0.5 + 1e-6, "{a} vs {b}");
    }
}

/// The packed activations hold exactly the ggml `Q8_K` blocks, whichever path quantized them.
#[test]
fn packed_q8_k_rows_are_ggml_blocks() {
    let mut rng = Rng::new(13);
    let pool = ThreadPool::new(2);
    let k = 768;
    for m in [1, 5, 37] {
        let x = activations(&mut rng, m * k);
        let serial = Activations::quantize(ActType::Q8_K, &x, m, k).expect("acts");
        let mut par = Activations::default();
        par.quantize_into_par(ActType::Q8_K, &x, m, k, &pool)
            .expect("acts");
        for r in 0..m {
            let mut want = vec![0u8; 3 * 292];
            scalar::quantize_row_q8_k(&x[r * k..(r + 1) * k], &mut want);
            assert_eq!(serial.ggml_row(r).expect("row"), want, "m={m} row {r}");
            assert_eq!(
                par.ggml_row(r).expect("row"),
                want,
                "m={m} row {r} (parallel)"
            );
        }
    }
    // Random K-quant weights multiply the same either way.
    let w = random_raw(&mut rng, QType::Q4_K, 3, k);
    let w = QMatrix::new(QType::Q4_K, 3, k, &w).expect("matrix");
    let x = activations(&mut rng, 2 * k);
    let mut out = vec![0f32; 6];
    matmul(&w, &x, 2, &mut out, &pool).expect("matmul");
    assert!(out.iter().all(|v| v.is_finite() && *v != 0.0), "{out:?}");
}
