//! gpt-oss's kernels against host computations: the clamped SwiGLU, YaRN rope and attention with
//! sinks (shoal-kernels' `attend_f16_sinks`, llama.cpp's CPU numerics). They fail with no adapter
//! unless `SHOAL_GPU_TESTS=skip`.

mod common;

use common::{gpu, random_vec};
use half::f16;
use shoal_gpu::{Attend, AttendWith, KvShape, Rope, RopeMode, RopeYarn};
use shoal_testkit::rng::SplitMix64;

/// Tolerance as `kernels.rs`'s SwiGLU: the GPU's `exp` is not correctly rounded, so 1e-5 relative
/// (+1e-6 absolute) of the f64 result; the inputs cross both clamps.
#[test]
fn clamped_swiglu_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(77);
    for n in [1, 33, 5000] {
        let gate = random_vec(&mut rng, n, -12.0, 12.0);
        let up = random_vec(&mut rng, n, -12.0, 12.0);
        let (gg, gu, gy) = (
            gpu.upload(&gate).unwrap(),
            gpu.upload(&up).unwrap(),
            gpu.zeros(n).unwrap(),
        );
        let mut cmd = gpu.commands();
        cmd.swiglu_oai(&gg, &gu, &gy).unwrap();
        cmd.submit().unwrap();
        let y = gpu.read(&gy).unwrap();
        for i in 0..n {
            let g = f64::from(gate[i].min(7.0));
            let u = f64::from(up[i].clamp(-7.0, 7.0));
            let exact = g / (1.0 + (-1.702 * g).exp()) * (u + 1.0);
            let err = (f64::from(y[i]) - exact).abs();
            assert!(
                err <= 1e-5 * exact.abs() + 1e-6,
                "[{i}]: {} vs {exact}",
                y[i]
            );
        }
    }
}

/// shoal-model's `RopeRows` with YaRN (`Yarn::angle`) for one position, in f32 as it computes it.
fn yarn_reference(x: &mut [f32], rope: &Rope<'_>, pos: usize) {
    let y = rope.yarn.expect("yarn");
    let half = rope.dims / 2;
    let theta_scale = rope.theta.powf(-2.0 / rope.dims as f32);
    let mut angle = pos as f32;
    let mut cs = Vec::new();
    for i in 0..half {
        let extrap = angle;
        let interp = rope.freq_scale * extrap;
        let t = if y.ext_factor == 0.0 {
            interp
        } else {
            let v = (i as f32 - y.corr[0]) / (y.corr[1] - y.corr[0]).max(0.001);
            let ramp = (1.0 - v.clamp(0.0, 1.0)) * y.ext_factor;
            interp * (1.0 - ramp) + extrap * ramp
        };
        cs.push((t.cos() * y.mscale, t.sin() * y.mscale));
        angle *= theta_scale;
    }
    for head in x.chunks_exact_mut(rope.head_dim) {
        for (i, &(c, s)) in cs.iter().enumerate() {
            let (j0, j1) = match rope.mode {
                RopeMode::Neox => (i, i + half),
                RopeMode::Interleaved => (2 * i, 2 * i + 1),
            };
            let (a, b) = (head[j0], head[j1]);
            head[j0] = a * c - b * s;
            head[j1] = a * s + b * c;
        }
    }
}

/// Tolerance as `kernels.rs`'s rope test, times the magnitude scale: the angles are the CPU's f32
/// operations, the GPU's sin and cos differ from the CPU's by a few 1e-7.
#[test]
fn yarn_rope_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(78);
    let yarns = [
        RopeYarn {
            ext_factor: 1.0,
            mscale: 1.0 + 0.1 * 32f32.ln(),
            corr: [8.0, 18.0],
        },
        RopeYarn {
            ext_factor: 0.0,
            mscale: 0.9,
            corr: [0.0, 0.0],
        },
    ];
    for yarn in yarns {
        let rope = Rope {
            mode: RopeMode::Neox,
            head_dim: 64,
            dims: 64,
            theta: 150_000.0,
            freq_scale: 1.0 / 32.0,
            factors: None,
            yarn: Some(yarn),
        };
        for pos in [0, 3, 1000, 30_000] {
            let x = random_vec(&mut rng, 2 * 64, -2.0, 2.0);
            let gx = gpu.upload(&x).unwrap();
            let mut cmd = gpu.commands();
            cmd.rope(&gx, 0, 2, rope, pos).unwrap();
            cmd.submit().unwrap();
            let got = gpu.read(&gx).unwrap();
            let mut want = x.clone();
            yarn_reference(&mut want, &rope, pos);
            for i in 0..x.len() {
                let tol = 2e-6 * yarn.mscale * x[i].abs().max(want[i].abs()).max(1.0);
                assert!(
                    (got[i] - want[i]).abs() <= tol,
                    "{yarn:?} pos {pos} [{i}]: {} vs {}",
                    got[i],
                    want[i]
                );
            }
        }
    }
}

/// Causal attention of a chunk with sinks against `attend_f16_sinks` per KV head: the weights sum
/// to less than 1, so the outputs are smaller than without sinks (checked: the sinks matter).
/// Tolerance: a weight may move by one f16 rounding step (2^-11) on the GPU's `exp`, so each output
/// is within 1e-3 · max |v| (+1e-6).
#[test]
fn attention_with_sinks_matches_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(79);
    let (n_heads, n_kv, hd, rows) = (4, 2, 32, 6);
    let shape = KvShape {
        layers: 1,
        capacity: 16,
        n_heads,
        n_kv_heads: n_kv,
        head_dim: hd,
        keys_only: false,
    };
    let cache = gpu.kv_cache(shape).unwrap();
    let (qd, kvd) = (n_heads * hd, n_kv * hd);
    let k = random_vec(&mut rng, rows * kvd, -2.0, 2.0);
    let v = random_vec(&mut rng, rows * kvd, -2.0, 2.0);
    let q = random_vec(&mut rng, rows * qd, -2.0, 2.0);
    let sinks = random_vec(&mut rng, n_heads, 1.0, 3.0);
    let (gk, gv, gq, gs) = (
        gpu.upload(&k).unwrap(),
        gpu.upload(&v).unwrap(),
        gpu.upload(&q).unwrap(),
        gpu.upload(&sinks).unwrap(),
    );
    let (with, without) = (gpu.zeros(rows * qd).unwrap(), gpu.zeros(rows * qd).unwrap());
    let at = Attend {
        layer: 0,
        pos: 0,
        window: 0,
        query_scale: None,
    };
    let mut cmd = gpu.commands();
    cmd.kv_write_rows(&cache, 0, 0, rows, &gk, 0, &gv, 0, kvd)
        .unwrap();
    let with_sinks = AttendWith {
        sinks: Some(&gs),
        score_scale: None,
    };
    cmd.attention_rows_with(&cache, (&gq, 0, qd), rows, at, with_sinks, &with)
        .unwrap();
    cmd.attention_rows(&cache, &gq, 0, qd, rows, at, &without)
        .unwrap();
    cmd.submit().unwrap();
    let (got, plain) = (gpu.read(&with).unwrap(), gpu.read(&without).unwrap());
    let r16 = |x: f32| f16::from_f32(x);
    let scale = 1.0 / (hd as f32).sqrt();
    let group = n_heads / n_kv;
    let mut moved = 0f32;
    for r in 0..rows {
        for g in 0..n_kv {
            let keys: Vec<f16> = (0..=r)
                .flat_map(|j| &k[j * kvd + g * hd..][..hd])
                .map(|&x| r16(x))
                .collect();
            let vals: Vec<f16> = (0..=r)
                .flat_map(|j| &v[j * kvd + g * hd..][..hd])
                .map(|&x| r16(x))
                .collect();
            let qg: Vec<f32> = q[r * qd + g * group * hd..][..group * hd]
                .iter()
                .map(|&x| r16(x).to_f32())
                .collect();
            let mut want = vec![0f32; group * hd];
            shoal_kernels::attn::attend_f16_sinks(
                &qg,
                group,
                &keys,
                &vals,
                hd,
                scale,
                Some(&sinks[g * group..(g + 1) * group]),
                &mut Vec::new(),
                &mut want,
            );
            let vmax = vals.iter().fold(0f32, |m, x| m.max(x.to_f32().abs()));
            for (i, &w) in want.iter().enumerate() {
                let at = r * qd + g * group * hd + i;
                assert!(
                    (got[at] - w).abs() <= 1e-3 * vmax + 1e-6,
                    "row {r} kv head {g} [{i}]: {} vs {w}",
                    got[at]
                );
                moved = moved.max((plain[at] - got[at]).abs());
            }
        }
    }
    assert!(moved > 0.05, "the sinks change the outputs ({moved})");
}
