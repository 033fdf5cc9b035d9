//! Every GPU kernel against a CPU reference on random data at small and odd shapes.
//!
//! These run on whatever adapter comes first: in CI that is Mesa's lavapipe (installed by
//! scripts/test). With no adapter they FAIL, unless `SHOAL_GPU_TESTS=skip` says to skip them.
//!
//! References are straightforward f64 sums over the weights as shoal-kernels dequantizes them
//! ([`shoal_kernels::dequantize_row`], bitwise ggml's), so the GPU result is checked against the
//! exact product of the same weights; tolerances are stated per kernel below.

mod common;

use common::{
    HEAD_LAYOUTS, K_SHAPES, PLAIN_SHAPES, SHAPES, check_attention, gpu, gpu_with, kv_shape_of,
    matvec_reference, random_matrix, random_vec,
};
use half::f16;
use shoal_gpu::{GPU_TYPES, Gpu, GpuError, MatvecConfig, OpenOptions};
use shoal_kernels::{QK, QMatrix, QType, dequantize_row, row_bytes};
use shoal_testkit::rng::SplitMix64;

/// Runs `W · x` on the GPU and checks it. Tolerance: every format is decoded exactly (f16 and
/// the quants are exact in f32; the IQ formats' grid values times their sub-block scales and
/// ±1/8 shifts, and `MXFP4`'s powers of two, too) and summed in f32, so
/// `|gpu − exact| ≤ 1e-5 · Σ|w·x| + 1e-6`.
fn check_matvec(
    gpu: &Gpu,
    qtype: QType,
    rows: usize,
    cols: usize,
    config: MatvecConfig,
    seed: u64,
) {
    let mut rng = SplitMix64::new(seed);
    let bytes = random_matrix(&mut rng, qtype, rows, cols);
    let w = QMatrix::new(qtype, rows, cols, &bytes).unwrap();
    let x = random_vec(&mut rng, cols, -1.0, 1.0);
    let gw = gpu.upload_matrix(&w).unwrap();
    let gx = gpu.upload(&x).unwrap();
    let gy = gpu.zeros(rows).unwrap();
    let mut cmds = gpu.commands();
    cmds.matvec_with(&gw, &gx, &gy, config).unwrap();
    cmds.submit().unwrap();
    let y = gpu.read(&gy).unwrap();
    let (exact, mag) = matvec_reference(&w, &x);
    for r in 0..rows {
        let err = (f64::from(y[r]) - exact[r]).abs();
        let tol = 1e-5 * mag[r] + 1e-6;
        assert!(
            err <= tol,
            "{} {rows}×{cols} {config:?} row {r}: gpu {} exact {} (err {err:e} > {tol:e})",
            qtype.name(),
            y[r],
            exact[r]
        );
    }
}

fn check_type(qtype: QType) {
    let Some(gpu) = gpu() else { return };
    let shapes: Vec<(usize, usize)> = match qtype.block_size() {
        1 => SHAPES.iter().chain(&PLAIN_SHAPES).copied().collect(),
        QK => SHAPES.to_vec(),
        _ => K_SHAPES.to_vec(),
    };
    for (i, &(rows, cols)) in shapes.iter().enumerate() {
        check_matvec(
            &gpu,
            qtype,
            rows,
            cols,
            MatvecConfig::default(),
            100 + i as u64,
        );
    }
}

/// One test per format, each at its shapes.
macro_rules! matvec_tests {
    ($($name:ident: $qtype:ident,)*) => {$(
        #[test]
        fn $name() {
            check_type(QType::$qtype);
        }
    )*};
}

matvec_tests! {
    matvec_f32_matches_the_cpu: F32,
    matvec_f16_matches_the_cpu: F16,
    matvec_q8_0_matches_the_cpu: Q8_0,
    matvec_q4_0_matches_the_cpu: Q4_0,
    matvec_q4_1_matches_the_cpu: Q4_1,
    matvec_q5_0_matches_the_cpu: Q5_0,
    matvec_q5_1_matches_the_cpu: Q5_1,
    matvec_q4_k_matches_the_cpu: Q4_K,
    matvec_q6_k_matches_the_cpu: Q6_K,
    matvec_bf16_matches_the_cpu: BF16,
    matvec_q5_k_matches_the_cpu: Q5_K,
    matvec_q3_k_matches_the_cpu: Q3_K,
    matvec_q2_k_matches_the_cpu: Q2_K,
    matvec_iq4_nl_matches_the_cpu: IQ4_NL,
    matvec_mxfp4_matches_the_cpu: MXFP4,
    matvec_iq4_xs_matches_the_cpu: IQ4_XS,
    matvec_iq2_xxs_matches_the_cpu: IQ2_XXS,
    matvec_iq2_xs_matches_the_cpu: IQ2_XS,
    matvec_iq2_s_matches_the_cpu: IQ2_S,
    matvec_iq3_xxs_matches_the_cpu: IQ3_XXS,
    matvec_iq3_s_matches_the_cpu: IQ3_S,
    matvec_iq1_s_matches_the_cpu: IQ1_S,
    matvec_iq1_m_matches_the_cpu: IQ1_M,
}

/// The override constants change the kernel's shape, never its result: one thread per row (no
/// reduction), a whole workgroup per row, several rows per workgroup.
#[test]
fn matvec_is_correct_at_every_workgroup_shape() {
    let Some(gpu) = gpu() else { return };
    let configs = [
        (1, 1),
        (8, 8),
        (32, 1),
        (64, 4),
        (128, 8),
        (256, 1),
        (256, 2),
    ];
    for (workgroup, rows) in configs {
        let config = MatvecConfig { workgroup, rows };
        for qtype in [
            QType::Q4_0,
            QType::Q8_0,
            QType::F16,
            QType::Q5_1,
            QType::MXFP4,
        ] {
            check_matvec(&gpu, qtype, 33, 96, config, 7);
            check_matvec(&gpu, qtype, 129, 544, config, 8);
        }
        for qtype in [
            QType::Q4_K,
            QType::Q6_K,
            QType::Q5_K,
            QType::Q3_K,
            QType::Q2_K,
            QType::IQ2_S,
            QType::IQ1_M,
        ] {
            check_matvec(&gpu, qtype, 33, 768, config, 7);
        }
    }
}

#[test]
fn matvec_refuses_shapes_the_kernel_cannot_reduce() {
    let Some(gpu) = gpu() else { return };
    let bytes = vec![0u8; row_bytes(QType::Q4_0, 64) * 4];
    let w = gpu
        .upload_matrix(&QMatrix::new(QType::Q4_0, 4, 64, &bytes).unwrap())
        .unwrap();
    let (x, y) = (gpu.zeros(64).unwrap(), gpu.zeros(4).unwrap());
    let mut cmds = gpu.commands();
    for (workgroup, rows) in [(64, 3), (48, 1), (512, 1), (0, 1), (64, 0)] {
        let err = cmds.matvec_with(&w, &x, &y, MatvecConfig { workgroup, rows });
        assert!(
            matches!(err, Err(GpuError::Config(_))),
            "{workgroup}/{rows}: {err:?}"
        );
    }
    let short = gpu.zeros(63).unwrap();
    assert!(matches!(
        cmds.matvec(&w, &short, &y),
        Err(GpuError::Shape(_))
    ));
    assert!(matches!(
        cmds.matvec(&w, &x, &short),
        Err(GpuError::Shape(_))
    ));
    cmds.submit().unwrap();
}

/// A matrix above the largest storage binding is split by rows into chunks that give the same
/// product; a single row above it is refused with a clear error.
#[test]
fn large_matrices_are_split_by_rows_and_huge_rows_refused() {
    let Some(gpu) = gpu_with(OpenOptions {
        max_binding: Some(4096),
    }) else {
        return;
    };
    assert_eq!(gpu.max_binding(), 4096);
    for qtype in [QType::Q4_0, QType::Q8_0, QType::F16, QType::F32] {
        check_matvec(&gpu, qtype, 129, 544, MatvecConfig::default(), 9);
        let bytes = vec![0u8; row_bytes(qtype, 544) * 129];
        let w = gpu
            .upload_matrix(&QMatrix::new(qtype, 129, 544, &bytes).unwrap())
            .unwrap();
        assert!(w.chunks() > 1, "{}: {} chunk(s)", qtype.name(), w.chunks());
    }
    for qtype in [QType::Q4_K, QType::Q6_K, QType::Q2_K, QType::Q5_K] {
        check_matvec(&gpu, qtype, 77, 512, MatvecConfig::default(), 10);
    }
    let bytes = vec![0u8; row_bytes(QType::F32, 1056) * 2];
    let err = gpu
        .upload_matrix(&QMatrix::new(QType::F32, 2, 1056, &bytes).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            GpuError::TooLarge {
                what: "one weight row",
                bytes: 4224,
                limit: 4096
            }
        ),
        "{err}"
    );
    assert!(matches!(gpu.zeros(1025), Err(GpuError::TooLarge { .. })));
}

/// Tolerance: the GPU sums squares in f32 (the reference in f64, as shoal-model's CPU path does),
/// so each value is within 1e-5 relative (+1e-6 absolute) of the exact result.
#[test]
fn rms_norm_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(11);
    for (rows, n) in [(1, 1), (1, 32), (3, 7), (2, 544), (5, 1000), (1, 4096)] {
        let x = random_vec(&mut rng, rows * n, -3.0, 3.0);
        let w = random_vec(&mut rng, n, -2.0, 2.0);
        let eps = 1e-5;
        let (gx, gw, gy) = (
            gpu.upload(&x).unwrap(),
            gpu.upload(&w).unwrap(),
            gpu.zeros(rows * n).unwrap(),
        );
        let mut cmds = gpu.commands();
        cmds.rms_norm(&gx, &gw, eps, &gy).unwrap();
        cmds.submit().unwrap();
        let y = gpu.read(&gy).unwrap();
        for (r, (xr, yr)) in x.chunks(n).zip(y.chunks(n)).enumerate() {
            let ss: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let scale = 1.0 / (ss / n as f64 + f64::from(eps)).sqrt();
            for i in 0..n {
                let exact = f64::from(xr[i]) * scale * f64::from(w[i]);
                let err = (f64::from(yr[i]) - exact).abs();
                assert!(
                    err <= 1e-5 * exact.abs() + 1e-6,
                    "{rows}×{n} row {r} [{i}]: gpu {} exact {exact}",
                    yr[i]
                );
            }
        }
    }
}

/// Tolerance: `exp` on the GPU is not correctly rounded (WGSL allows a few ulp, more on some
/// drivers), so 1e-5 relative (+1e-6 absolute) of the f64 result.
#[test]
fn swiglu_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(12);
    for n in [1, 7, 256, 1000, 70_001] {
        let gate = random_vec(&mut rng, n, -8.0, 8.0);
        let up = random_vec(&mut rng, n, -2.0, 2.0);
        let (gg, gu, gy) = (
            gpu.upload(&gate).unwrap(),
            gpu.upload(&up).unwrap(),
            gpu.zeros(n).unwrap(),
        );
        let mut cmds = gpu.commands();
        cmds.swiglu(&gg, &gu, &gy).unwrap();
        cmds.submit().unwrap();
        let y = gpu.read(&gy).unwrap();
        for i in 0..n {
            let g = f64::from(gate[i]);
            let exact = g / (1.0 + (-g).exp()) * f64::from(up[i]);
            let err = (f64::from(y[i]) - exact).abs();
            assert!(
                err <= 1e-5 * exact.abs() + 1e-6,
                "n {n} [{i}]: gpu {} exact {exact}",
                y[i]
            );
        }
    }
}

/// A decoder MLP's chain in one command buffer: norm → gate/up matvecs → SwiGLU → down matvec,
/// against the same chain on the CPU (f32 between steps, as the GPU keeps them).
#[test]
fn a_chained_mlp_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(13);
    let (d, f) = (96, 160);
    let x = random_vec(&mut rng, d, -2.0, 2.0);
    let norm = random_vec(&mut rng, d, 0.5, 1.5);
    let wg = random_matrix(&mut rng, QType::Q4_0, f, d);
    let wu = random_matrix(&mut rng, QType::Q8_0, f, d);
    let wd = random_matrix(&mut rng, QType::F16, d, f);
    let (wg, wu, wd) = (
        QMatrix::new(QType::Q4_0, f, d, &wg).unwrap(),
        QMatrix::new(QType::Q8_0, f, d, &wu).unwrap(),
        QMatrix::new(QType::F16, d, f, &wd).unwrap(),
    );
    let bufs: Vec<_> = [d, f, f, f, d]
        .iter()
        .map(|&n| gpu.zeros(n).unwrap())
        .collect();
    let [h, g, u, a, out] = &bufs[..] else {
        unreachable!()
    };
    let (gx, gn) = (gpu.upload(&x).unwrap(), gpu.upload(&norm).unwrap());
    let (gwg, gwu, gwd) = (
        gpu.upload_matrix(&wg).unwrap(),
        gpu.upload_matrix(&wu).unwrap(),
        gpu.upload_matrix(&wd).unwrap(),
    );
    let mut cmds = gpu.commands();
    cmds.rms_norm(&gx, &gn, 1e-6, h).unwrap();
    cmds.matvec(&gwg, h, g).unwrap();
    cmds.matvec(&gwu, h, u).unwrap();
    cmds.swiglu(g, u, a).unwrap();
    cmds.matvec(&gwd, a, out).unwrap();
    cmds.submit().unwrap();
    let y = gpu.read(out).unwrap();

    let ss: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let scale = (1.0 / (ss / d as f64 + 1e-6).sqrt()) as f32;
    let hn: Vec<f32> = x.iter().zip(&norm).map(|(&v, &w)| v * scale * w).collect();
    let to_f32 = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect::<Vec<_>>();
    let gc = to_f32(matvec_reference(&wg, &hn).0);
    let uc = to_f32(matvec_reference(&wu, &hn).0);
    let ac: Vec<f32> = gc
        .iter()
        .zip(&uc)
        .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
        .collect();
    let (exact, mag) = matvec_reference(&wd, &ac);
    // Rounding of every step compounds: 1e-4 of the output's Σ|w·a|.
    for i in 0..d {
        let err = (f64::from(y[i]) - exact[i]).abs();
        assert!(
            err <= 1e-4 * mag[i] + 1e-5,
            "[{i}]: gpu {} cpu {}",
            y[i],
            exact[i]
        );
    }
}

#[test]
fn discover_lists_the_adapter_it_opens() {
    let Some(gpu) = gpu() else { return };
    let all = Gpu::discover();
    assert!(!all.is_empty());
    let info = gpu.info();
    assert_eq!(info, &all[0]);
    assert!(!info.name.is_empty());
    assert!(
        ["vulkan", "metal", "dx12"].contains(&info.backend),
        "{info:?}"
    );
    assert!(info.max_storage_binding >= 128 << 20, "{info:?}");
    assert_eq!(
        gpu.max_binding(),
        info.max_storage_binding.min(info.max_buffer)
    );
    assert!(matches!(
        Gpu::open(all.len()),
        Err(GpuError::NoAdapter { found, .. }) if found == all.len()
    ));
}

/// With a Vulkan loader but no driver (an ICD list naming nothing), discovery is empty and opening
/// fails with `NoAdapter`, without a panic. Run in a child process, whose environment is its own.
#[cfg(target_os = "linux")]
#[test]
fn no_driver_means_no_adapter_and_no_panic() {
    if std::env::var_os("SHOAL_GPU_CHILD").is_some() {
        assert!(Gpu::discover().is_empty(), "{:?}", Gpu::discover());
        assert!(matches!(Gpu::open_first(), Ok(None)));
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "no_driver_means_no_adapter_and_no_panic",
            "--nocapture",
        ])
        .env("SHOAL_GPU_CHILD", "1")
        .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
        .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// shoal-model's `RopeRows` for one position, in f32 exactly as it computes (the angle advanced
/// by repeated multiplication, divided by the factor, scaled; f32 `cos`/`sin`), applied to every
/// head. (shoal-model itself is not a dependency: it pulls candle.)
fn rope_reference(x: &mut [f32], rope: &shoal_gpu::Rope<'_>, factors: Option<&[f32]>, pos: usize) {
    let (half, neox) = (rope.dims / 2, rope.mode == shoal_gpu::RopeMode::Neox);
    let theta_scale = rope.theta.powf(-2.0 / rope.dims as f32);
    let mut angle = pos as f32;
    let mut cs = Vec::new();
    for i in 0..half {
        let ff = factors.map_or(1.0, |f| f[i]);
        let t = rope.freq_scale * (angle / ff);
        cs.push((t.cos(), t.sin()));
        angle *= theta_scale;
    }
    for head in x.chunks_exact_mut(rope.head_dim) {
        for (i, &(c, s)) in cs.iter().enumerate() {
            let (j0, j1) = if neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (a, b) = (head[j0], head[j1]);
            head[j0] = a * c - b * s;
            head[j1] = a * s + b * c;
        }
    }
}

/// Tolerance: the angle is computed with the CPU's f32 operations; the GPU's sin and cos (after
/// its reduction to [-π, π]) differ from the CPU's by a few 1e-7, so each value is within
/// 2e-6 · max(|a|, |b|, 1) of the CPU's rotation of its pair, at positions up to 32767.
#[test]
fn rope_matches_the_cpu() {
    use shoal_gpu::{Rope, RopeMode};
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(21);
    let cases = [
        (RopeMode::Interleaved, 4, 64, 64, 10_000.0, 1.0, false),
        (RopeMode::Neox, 3, 128, 128, 1_000_000.0, 1.0, false),
        (RopeMode::Neox, 2, 96, 32, 10_000.0, 0.25, false),
        (RopeMode::Interleaved, 5, 64, 64, 500_000.0, 1.0, true),
        (RopeMode::Neox, 1, 256, 256, 10_000.0, 1.0, true),
    ];
    for (mode, heads, hd, dims, theta, freq_scale, with_factors) in cases {
        let factors: Vec<f32> = (0..dims / 2).map(|i| 1.0 + (i % 3) as f32 * 0.5).collect();
        let gf = gpu.upload(&factors).unwrap();
        let rope = Rope {
            mode,
            head_dim: hd,
            dims,
            theta,
            freq_scale,
            factors: with_factors.then_some(&gf),
            yarn: None,
        };
        for pos in [0, 1, 17, 1000, 4095, 32_767] {
            let x = random_vec(&mut rng, heads * hd + 3, -2.0, 2.0);
            let gx = gpu.upload(&x).unwrap();
            let mut cmds = gpu.commands();
            cmds.rope(&gx, 3, heads, rope, pos).unwrap();
            cmds.submit().unwrap();
            let y = gpu.read(&gx).unwrap();
            let mut want = x.clone();
            let f = with_factors.then_some(&factors[..]);
            rope_reference(&mut want[3..], &rope, f, pos);
            assert_eq!(&y[..3], &x[..3], "values before the offset are untouched");
            for i in 3..x.len() {
                let err = (y[i] - want[i]).abs();
                let tol = 2e-6 * x[i].abs().max(want[i].abs()).max(1.0);
                assert!(
                    err <= tol,
                    "{mode:?} {heads}×{hd}/{dims} θ {theta} pos {pos} [{i}]: gpu {} cpu {}",
                    y[i],
                    want[i]
                );
            }
        }
    }
}

/// Decode attention against shoal-kernels' `attend_f16` (llama.cpp's CPU numerics) and an f64
/// softmax over the same f16 keys, values and query, after writing every position with
/// `kv_write`; tolerances as `common::check_attention` states.
#[test]
fn decode_attention_matches_the_cpu() {
    use shoal_gpu::Attend;
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(31);
    let r16 = |v: f32| f16::from_f32(v).to_f32();
    for layout in HEAD_LAYOUTS {
        let (n_heads, n_kv, hd) = layout;
        let shape = kv_shape_of(layout);
        let (layers, cap) = (shape.layers, shape.capacity);
        let cache = gpu.kv_cache(shape).unwrap();
        let kvd = n_kv * hd;
        // Host copies per layer: [pos][kv_head][hd], rounded to f16.
        let mut hk = vec![vec![0f32; cap * kvd]; layers];
        let mut hv = hk.clone();
        for layer in 0..layers {
            for pos in 0..cap {
                // k and v from offsets inside larger vectors, as from a fused QKV row.
                let k = random_vec(&mut rng, kvd + 5, -2.0, 2.0);
                let v = random_vec(&mut rng, kvd + 2, -2.0, 2.0);
                let (gk, gv) = (gpu.upload(&k).unwrap(), gpu.upload(&v).unwrap());
                let mut cmds = gpu.commands();
                cmds.kv_write(&cache, layer, pos, &gk, 5, &gv, 2).unwrap();
                cmds.submit().unwrap();
                for i in 0..kvd {
                    hk[layer][pos * kvd + i] = r16(k[5 + i]);
                    hv[layer][pos * kvd + i] = r16(v[2 + i]);
                }
            }
        }
        for (layer, pos, window, query_scale) in [
            (0, 0, 0, None),
            (1, 7, 0, None),
            (0, 39, 0, Some(0.125)),
            (1, 39, 5, None),
            (0, 20, 1, Some(0.3)),
        ] {
            let q = random_vec(&mut rng, n_heads * hd + 1, -2.0, 2.0);
            let (gq, out) = (gpu.upload(&q).unwrap(), gpu.zeros(n_heads * hd).unwrap());
            let at = Attend {
                layer,
                pos,
                window,
                query_scale,
            };
            let mut cmds = gpu.commands();
            cmds.attention(&cache, &gq, 1, at, &out).unwrap();
            cmds.submit().unwrap();
            let y = gpu.read(&out).unwrap();

            let len = pos + 1;
            let first = if window == 0 {
                0
            } else {
                len.saturating_sub(window)
            };
            let (qs, scale) = match query_scale {
                Some(s) => (s, 1.0),
                None => (1.0, 1.0 / (hd as f32).sqrt()),
            };
            let qr: Vec<f32> = q[1..].iter().map(|&v| r16(v * qs)).collect();
            let group = n_heads / n_kv;
            for g in 0..n_kv {
                let keys: Vec<f16> = (first..len)
                    .flat_map(|j| &hk[layer][j * kvd + g * hd..][..hd])
                    .map(|&v| f16::from_f32(v))
                    .collect();
                let vals: Vec<f16> = (first..len)
                    .flat_map(|j| &hv[layer][j * kvd + g * hd..][..hd])
                    .map(|&v| f16::from_f32(v))
                    .collect();
                let qg = &qr[g * group * hd..(g + 1) * group * hd];
                let got = &y[g * group * hd..(g + 1) * group * hd];
                let ctx = format!(
                    "{n_heads}/{n_kv}×{hd} layer {layer} pos {pos} window {window} kv head {g}"
                );
                check_attention(qg, group, &keys, &vals, hd, scale, got, &ctx);
            }
        }
    }
}

/// Bitwise, for every format: the embedding row is decoded as the matrix kernels decode it, and
/// every decoded value is exact in f32 (a scale times small integers, or `d·q ± m` with `d·q`
/// exact, rounded once as the CPU rounds it), then `· scale`; also from a table split into chunks.
#[test]
fn embedding_rows_match_the_cpu_bitwise() {
    for max_binding in [None, Some(4096)] {
        let Some(gpu) = gpu_with(OpenOptions { max_binding }) else {
            return;
        };
        let mut rng = SplitMix64::new(41);
        for qtype in GPU_TYPES {
            let (rows, cols) = match qtype.block_size() {
                1 => (50, 94),
                QK => (50, 96),
                _ => (20, 256),
            };
            let bytes = random_matrix(&mut rng, qtype, rows, cols);
            let w = QMatrix::new(qtype, rows, cols, &bytes).unwrap();
            let gw = gpu.upload_matrix(&w).unwrap();
            let rb = row_bytes(qtype, cols);
            for (row, scale) in [(0, 1.0f32), (17, 2.5), (rows - 1, 9.797_959)] {
                let y = gpu.zeros(cols).unwrap();
                let mut cmds = gpu.commands();
                cmds.embed(&gw, row, scale, &y).unwrap();
                cmds.submit().unwrap();
                let mut want = vec![0f32; cols];
                dequantize_row(qtype, &bytes[row * rb..(row + 1) * rb], &mut want).unwrap();
                let want: Vec<u32> = want.iter().map(|v| (scale * v).to_bits()).collect();
                let got: Vec<u32> = gpu.read(&y).unwrap().iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{} row {row} ({max_binding:?})", qtype.name());
            }
            let mut cmds = gpu.commands();
            assert!(
                cmds.embed(&gw, rows, 1.0, &gpu.zeros(cols).unwrap())
                    .is_err()
            );
        }
    }
}

#[test]
fn residual_add_is_exact() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(51);
    for n in [1, 7, 1000, 70_001] {
        let (a, b) = (
            random_vec(&mut rng, n, -5.0, 5.0),
            random_vec(&mut rng, n, -5.0, 5.0),
        );
        let (ga, gb, gy) = (
            gpu.upload(&a).unwrap(),
            gpu.upload(&b).unwrap(),
            gpu.zeros(n).unwrap(),
        );
        let mut cmds = gpu.commands();
        cmds.add(&ga, &gb, &gy).unwrap();
        cmds.submit().unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(gpu.read(&gy).unwrap(), want, "n {n}");
    }
}
