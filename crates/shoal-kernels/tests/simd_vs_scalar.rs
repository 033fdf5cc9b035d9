//! Every SIMD backend this CPU supports against the scalar reference.

mod common;

use common::{Rng, TYPES, activations, fit_k, random_raw, random_weights};
use shoal_kernels::{ActType, Backend, QType, row_bytes, scalar, vec_dot_with};

const KS: [usize; 7] = [32, 64, 96, 160, 576, 1536, 2080];
fn quantize_acts(qtype: QType, x: &[f32]) -> Vec<u8> {
    let act = qtype.act_type();
    let mut out = vec![0u8; act.try_row_bytes(x.len()).expect("k")];
    match act {
        ActType::F32 => out
            .iter_mut()
            .zip(x.iter().flat_map(|v| v.to_le_bytes()))
            .for_each(|(o, b)| *o = b),
        ActType::Q8_1 => scalar::quantize_row_q8_1(x, &mut out),
        ActType::Q8_0 => scalar::quantize_row_q8_0(x, &mut out),
        ActType::Q8_K => scalar::quantize_row_q8_k(x, &mut out),
    }
    out
}

/// Σ|w·x| over the row: the scale against which rounding differences are judged.
fn abs_dot(qtype: QType, k: usize, w: &[u8], xq: &[u8]) -> f32 {
    let mut wf = vec![0f32; k];
    shoal_kernels::dequantize_row(qtype, w, &mut wf).expect("decode");
    let mut xf = vec![0f32; k];
    match qtype.act_type() {
        ActType::F32 => scalar::dequantize_row_f32(xq, &mut xf),
        ActType::Q8_1 => scalar::dequantize_row_q8_1(xq, &mut xf),
        ActType::Q8_0 => scalar::dequantize_row_q8_0(xq, &mut xf),
        ActType::Q8_K => scalar::dequantize_row_q8_k(xq, &mut xf),
    }
    wf.iter().zip(&xf).map(|(a, b)| (a * b).abs()).sum()
}

fn check_backend(backend: Backend, raw: bool) {
    let mut rng = Rng::new(7 + raw as u64);
    for qtype in TYPES {
        for k in KS {
            let k = fit_k(qtype, k);
            for row in 0..8 {
                let w = if raw {
                    random_raw(&mut rng, qtype, 1, k)
                } else {
                    random_weights(&mut rng, qtype, 1, k)
                };
                let x = activations(&mut rng, k);
                let xq = quantize_acts(qtype, &x);
                let want = vec_dot_with(Backend::Scalar, qtype, k, &w, &xq);
                let got = vec_dot_with(backend, qtype, k, &w, &xq);
                let scale = abs_dot(qtype, k, &w, &xq);
                let tol = 2e-6 * scale + 1e-6;
                assert!(
                    (got - want).abs() <= tol,
                    "{backend:?} {qtype:?} k={k} row={row}: simd {got} vs scalar {want} (tol {tol})"
                );
            }
        }
    }
}

#[test]
fn vec_dot_matches_scalar_on_quantized_weights() {
    for b in Backend::supported() {
        check_backend(b, false);
    }
}

#[test]
fn vec_dot_matches_scalar_on_arbitrary_block_bytes() {
    for b in Backend::supported() {
        check_backend(b, true);
    }
}

#[test]
fn f32_dot_handles_lengths_that_are_not_multiples_of_eight() {
    let mut rng = Rng::new(3);
    for k in [1, 7, 9, 31, 33, 100] {
        let w: Vec<u8> = activations(&mut rng, k)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let x: Vec<u8> = activations(&mut rng, k)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let want = scalar::vec_dot_f32(k, &w, &x);
        for b in Backend::supported() {
            let got = vec_dot_with(b, QType::F32, k, &w, &x);
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{b:?} k={k}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn simd_activation_quantization_is_bitwise_equal_to_scalar() {
    let mut rng = Rng::new(11);
    for k in KS {
        let mut x = activations(&mut rng, k);
        // Exact ties and zeros: a zero block, values that land on .5 after scaling.
        x[..32].iter_mut().for_each(|v| *v = 0.0);
        if k >= 64 {
            x[32] = 127.0;
            x[33] = 0.5;
            x[34] = -1.5;
            x[35] = 2.5;
        }
        for act in [ActType::Q8_1, ActType::Q8_0] {
            let rb = act.try_row_bytes(k).expect("k");
            let mut want = vec![0u8; rb];
            match act {
                ActType::Q8_1 => scalar::quantize_row_q8_1(&x, &mut want),
                _ => scalar::quantize_row_q8_0(&x, &mut want),
            }
            let mut got = vec![0u8; rb];
            match act {
                ActType::Q8_1 => shoal_kernels::quantize_row_q8_1(&x, &mut got).expect("q8_1"),
                _ => shoal_kernels::quantize_row_q8_0(&x, &mut got).expect("q8_0"),
            }
            assert_eq!(got, want, "{act:?} k={k} ({:?})", Backend::detect());
            if act == ActType::Q8_1 && k >= 64 {
                // The tie cases: 0.5 and 2.5 round to even after scaling by 127/127 = 1.
                assert_eq!(&got[36 + 4..36 + 8], &[127, 0, (-2i8) as u8, 2]);
            }
        }
    }
}

#[test]
fn simd_q8_k_quantization_is_bitwise_equal_to_scalar() {
    let mut rng = Rng::new(17);
    for k in [256, 512, 2304] {
        let mut x = activations(&mut rng, k);
        x[..256].iter_mut().for_each(|v| *v = 0.0); // a zero block
        if k >= 512 {
            // Equal magnitudes of both signs: the first one sets the sign of d.
            x[300] = -50.0;
            x[301] = 50.0;
            // Values that land on .5 after scaling by 127 / 50.
            x[302] = 50.0 / 127.0 * 2.5;
            x[303] = -50.0 / 127.0 * 0.5;
            x[304] = f32::NAN; // ignored by the maximum, quantized to 0
        }
        let rb = ActType::Q8_K.try_row_bytes(k).expect("k");
        let mut want = vec![0u8; rb];
        scalar::quantize_row_q8_k(&x, &mut want);
        let mut got = vec![0u8; rb];
        shoal_kernels::quantize_row_q8_k(&x, &mut got).expect("q8_k");
        assert_eq!(got, want, "k={k} ({:?})", Backend::detect());
        if k >= 512 {
            let q = &got[292 + 4..];
            assert_eq!(q[44] as i8, -127, "the first extreme maps to -127");
            assert_eq!(q[45] as i8, 127);
            assert_eq!(q[48], 0, "NaN quantizes to 0");
        }
    }
}

#[test]
fn q4_1_nibble_order_matches_ggml() {
    // One block: low nibbles hold values 0..16, high nibbles 16..32.
    let mut block = vec![0u8; 20];
    block[0..2].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
    block[2..4].copy_from_slice(&half::f16::from_f32(-8.0).to_le_bytes());
    for j in 0..16 {
        block[4 + j] = (j as u8) | ((15 - j as u8) << 4);
    }
    let mut out = vec![0f32; 32];
    shoal_kernels::dequantize_row(QType::Q4_1, &block, &mut out).expect("decode");
    for j in 0..16 {
        assert_eq!(out[j], j as f32 - 8.0);
        assert_eq!(out[16 + j], (15 - j) as f32 - 8.0);
    }
    // The dot against a one-hot activation picks the same values on every backend.
    for pos in [0, 5, 16, 31] {
        let mut x = vec![0f32; 32];
        x[pos] = 1.0;
        let xq = quantize_acts(QType::Q4_1, &x);
        for b in Backend::supported() {
            let got = vec_dot_with(b, QType::Q4_1, 32, &block, &xq);
            assert!(
                (got - out[pos]).abs() < 2e-3 * out[pos].abs(),
                "{b:?} pos {pos}: {got} vs {}",
                out[pos]
            );
        }
    }
    assert_eq!(row_bytes(QType::Q4_1, 64), 40);
}

#[test]
fn backend_detection_is_consistent() {
    let b = Backend::detect();
    assert!(b.is_supported());
    assert!(Backend::supported().contains(&b));
    assert!(Backend::supported().contains(&Backend::Scalar));
    #[cfg(target_arch = "x86_64")]
    if std::env::var("SHOAL_KERNEL_BACKEND").is_err() && std::arch::is_x86_feature_detected!("avx2")
    {
        assert_ne!(b, Backend::Scalar, "an AVX2 CPU should get a SIMD backend");
    }
    #[cfg(target_arch = "aarch64")]
    {
        // Every aarch64 CPU has NEON; `dotprod` decides the level.
        assert!(Backend::supported().contains(&Backend::Neon));
        let dot = std::arch::is_aarch64_feature_detected!("dotprod");
        assert_eq!(Backend::supported().contains(&Backend::NeonDot), dot);
        let i8mm = dot && std::arch::is_aarch64_feature_detected!("i8mm");
        assert_eq!(Backend::supported().contains(&Backend::NeonI8mm), i8mm);
        if std::env::var("SHOAL_KERNEL_BACKEND").is_err() {
            let want = match (dot, i8mm) {
                (_, true) => Backend::NeonI8mm,
                (true, _) => Backend::NeonDot,
                _ => Backend::Neon,
            };
            assert_eq!(b, want, "an aarch64 CPU gets its best NEON level");
        }
    }
    // The test step names the level its (emulated) CPU must get: a CPU model that stopped
    // reporting a feature fails here instead of leaving that level's kernels untested.
    if let Ok(want) = std::env::var("SHOAL_EXPECT_BACKEND") {
        assert_eq!(
            b.name(),
            want,
            "SHOAL_EXPECT_BACKEND: the level this CPU must get"
        );
    }
    #[cfg(not(target_arch = "aarch64"))]
    for other in [Backend::Neon, Backend::NeonDot, Backend::NeonI8mm] {
        assert!(!other.is_supported(), "{other:?} off aarch64");
    }
}

/// The NEON kernels of the quantized formats (not the IQ formats, not the plain ones, which sum
/// floats in another order) are bitwise equal to the scalar reference: exact integer sums per
/// block and the reference's float steps. On aarch64 only.
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_quantized_dots_are_bitwise_equal_to_scalar() {
    let neon: Vec<Backend> = Backend::supported()
        .into_iter()
        .filter(|b| matches!(b, Backend::Neon | Backend::NeonDot | Backend::NeonI8mm))
        .collect();
    #[cfg(target_arch = "aarch64")]
    assert!(!neon.is_empty(), "NEON is not detected on aarch64");
    let mut rng = Rng::new(99);
    for qtype in QType::ALL
        .into_iter()
        .filter(|q| !matches!(q, QType::F32 | QType::F16 | QType::BF16))
    {
        for k in [256, 512, 2304] {
            for raw in [false, true] {
                let w = if raw {
                    random_raw(&mut rng, qtype, 1, k)
                } else {
                    random_weights(&mut rng, qtype, 1, k)
                };
                let xq = quantize_acts(qtype, &activations(&mut rng, k));
                let want = vec_dot_with(Backend::Scalar, qtype, k, &w, &xq);
                for &b in &neon {
                    let got = vec_dot_with(b, qtype, k, &w, &xq);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{b:?} {qtype:?} k={k} raw={raw}"
                    );
                }
            }
        }
    }
}
