//! The kernels a whole decoder layer over a batch adds (lavapipe in CI): RoPE over rows against
//! RoPE of each row alone, GeGLU against ggml's f16-table GELU, the broadcast bias add, row copies,
//! the KV copy a sequence grows, keeps a prefix or forks with, and a keys-only (latent-attention)
//! cache.

mod common;

use common::{gpu, kv_shape_of, random_vec};
use half::f16;
use shoal_gpu::{Attend, KvShape, Rope, RopeMode};
use shoal_testkit::rng::SplitMix64;

/// Each row of a `rope_rows` dispatch is bitwise what `rope` gives that row at its position.
#[test]
fn rope_over_rows_equals_rope_of_each_row() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(5);
    for mode in [RopeMode::Interleaved, RopeMode::Neox] {
        let (heads, hd, stride, rows) = (3, 32, 3 * 32 + 10, 4);
        let rope = Rope {
            mode,
            head_dim: hd,
            dims: 24,
            theta: 10_000.0,
            freq_scale: 1.0,
            factors: None,
            yarn: None,
        };
        let x = random_vec(&mut rng, 2 + rows * stride, -2.0, 2.0);
        let positions = [0u32, 7, 8, 300];
        let all = gpu.upload(&x).unwrap();
        let mut cmd = gpu.commands();
        cmd.rope_rows(&all, (2, stride), heads, rope, &positions)
            .unwrap();
        cmd.submit().unwrap();
        let got = gpu.read(&all).unwrap();
        let one = gpu.upload(&x).unwrap();
        let mut cmd = gpu.commands();
        for (r, &p) in positions.iter().enumerate() {
            cmd.rope(&one, 2 + r * stride, heads, rope, p as usize)
                .unwrap();
        }
        cmd.submit().unwrap();
        assert_eq!(got, gpu.read(&one).unwrap(), "{mode:?}");
        // Values outside the rows' heads are untouched.
        assert_eq!(got[..2], x[..2]);
    }
}

/// ggml's CPU GELU: through a table of every f16 input, the result rounded to f16.
fn gelu_f16(x: f32) -> f32 {
    let h = f16::from_f32(x).to_f32();
    let y = 0.5 * h * (1.0 + (0.797_884_6 * h * (1.0 + 0.044715 * h * h)).tanh());
    f16::from_f32(y).to_f32()
}

/// Within one f16 rounding step of the result (the GPU's tanh may differ from the CPU's in the
/// last bits, which can move the rounding), or f16's smallest normal value for results below it
/// (WGSL lets `quantizeToF16` flush f16 subnormals to zero, and lavapipe does: gelu(-4.4) ≈ -8e-6
/// becomes 0); exact at and beyond ±10.
#[test]
fn geglu_matches_ggml_s_f16_table_gelu() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(6);
    let mut gate = random_vec(&mut rng, 1000, -12.0, 12.0);
    gate.extend([-10.0, 10.0, 0.0, -0.0, 1e-8]);
    let up = random_vec(&mut rng, gate.len(), -3.0, 3.0);
    let (g, u, y) = (
        gpu.upload(&gate).unwrap(),
        gpu.upload(&up).unwrap(),
        gpu.zeros(gate.len()).unwrap(),
    );
    let mut cmd = gpu.commands();
    cmd.geglu(&g, &u, &y).unwrap();
    cmd.submit().unwrap();
    for ((&x, &b), got) in gate.iter().zip(&up).zip(gpu.read(&y).unwrap()) {
        let want = match x {
            x if x <= -10.0 => 0.0,
            x if x >= 10.0 => x * b,
            x => gelu_f16(x) * b,
        };
        let step = (f16::from_f32(want / b).to_f32().abs() * 1e-3).max(6.2e-5);
        assert!(
            (got - want).abs() <= step * b.abs(),
            "gelu({x}) · {b}: {got} vs {want}"
        );
    }
}

#[test]
fn bias_add_and_row_copies_are_exact() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(7);
    let (rows, n) = (5, 13);
    let a = random_vec(&mut rng, rows * n, -1.0, 1.0);
    let b = random_vec(&mut rng, n, -1.0, 1.0);
    let (ga, gb, gy) = (
        gpu.upload(&a).unwrap(),
        gpu.upload(&b).unwrap(),
        gpu.zeros(rows * n).unwrap(),
    );
    // Columns 3..9 of every row into a vector of rows of 6.
    let cols = gpu.zeros(rows * 6).unwrap();
    let mut cmd = gpu.commands();
    cmd.add_rows(&ga, &gb, &gy).unwrap();
    cmd.copy_rows(&ga, (3, n), &cols, (0, 6), rows, 6).unwrap();
    cmd.submit().unwrap();
    let want: Vec<f32> = a.iter().enumerate().map(|(i, v)| v + b[i % n]).collect();
    assert_eq!(gpu.read(&gy).unwrap(), want);
    let want: Vec<f32> = a.chunks(n).flat_map(|r| r[3..9].to_vec()).collect();
    assert_eq!(gpu.read(&cols).unwrap(), want);
    let mut cmd = gpu.commands();
    assert!(cmd.add_rows(&ga, &gpu.zeros(7).unwrap(), &gy).is_err());
    assert!(cmd.copy_rows(&ga, (3, n), &cols, (0, 6), rows, 7).is_err());
}

/// Attention over a copy is bitwise attention over the original, for the copied positions, into
/// a bigger cache or a compact one; shapes that differ are refused.
#[test]
fn kv_copies_attend_as_the_original() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(8);
    let layout = (4, 2, 16);
    let shape = kv_shape_of(layout);
    let (qd, kvd) = (4 * 16, 2 * 16);
    let len = 9;
    let src = gpu.kv_cache(shape).unwrap();
    let k = gpu
        .upload(&random_vec(&mut rng, len * kvd, -1.0, 1.0))
        .unwrap();
    let v = gpu
        .upload(&random_vec(&mut rng, len * kvd, -1.0, 1.0))
        .unwrap();
    let q = gpu.upload(&random_vec(&mut rng, qd, -1.0, 1.0)).unwrap();
    let mut cmd = gpu.commands();
    for layer in 0..shape.layers {
        cmd.kv_write_rows(&src, layer, 0, len, &k, 0, &v, 0, kvd)
            .unwrap();
    }
    cmd.submit().unwrap();
    let attend = |cache: &shoal_gpu::GpuKvCache, layer| {
        let out = gpu.zeros(qd).unwrap();
        let mut cmd = gpu.commands();
        let at = Attend {
            layer,
            pos: len - 1,
            window: 0,
            query_scale: None,
        };
        cmd.attention(cache, &q, 0, at, &out).unwrap();
        cmd.submit().unwrap();
        gpu.read(&out).unwrap()
    };
    for capacity in [len, 64] {
        let dst = gpu.kv_cache(KvShape { capacity, ..shape }).unwrap();
        gpu.kv_copy(&src, &dst, len).unwrap();
        for layer in 0..shape.layers {
            assert_eq!(
                attend(&dst, layer),
                attend(&src, layer),
                "capacity {capacity}"
            );
        }
    }
    let other = gpu
        .kv_cache(KvShape {
            head_dim: 8,
            ..shape
        })
        .unwrap();
    assert!(gpu.kv_copy(&src, &other, len).is_err());
    let small = gpu
        .kv_cache(KvShape {
            capacity: 4,
            ..shape
        })
        .unwrap();
    assert!(gpu.kv_copy(&src, &small, len).is_err());
}

/// A keys-only cache (latent attention: each key is its own value) attends as a full cache whose
/// values are the keys, bitwise, also after growing by a device copy; it keeps no value buffer.
#[test]
fn a_keys_only_cache_attends_with_its_keys_as_values() {
    use shoal_gpu::AttendWith;
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(12);
    let (n_heads, hd, rows) = (4, 40, 5);
    let full = KvShape {
        layers: 2,
        capacity: 8,
        n_heads,
        n_kv_heads: 1,
        head_dim: hd,
        keys_only: false,
    };
    let keys_only = KvShape {
        keys_only: true,
        ..full
    };
    let k = random_vec(&mut rng, rows * hd, -2.0, 2.0);
    let q = random_vec(&mut rng, rows * n_heads * hd, -2.0, 2.0);
    let (gk, gq) = (gpu.upload(&k).unwrap(), gpu.upload(&q).unwrap());
    let junk = gpu.upload(&vec![9.0; rows * hd]).unwrap();
    let at = Attend {
        layer: 1,
        pos: 0,
        window: 0,
        query_scale: None,
    };
    let with = AttendWith {
        sinks: None,
        score_scale: Some(0.3),
    };
    let attend = |cache: &shoal_gpu::GpuKvCache, values: &shoal_gpu::GpuVec| {
        let out = gpu.zeros(rows * n_heads * hd).unwrap();
        let mut cmd = gpu.commands();
        cmd.kv_write_rows(cache, 1, 0, rows, &gk, 0, values, 0, hd)
            .unwrap();
        cmd.attention_rows_with(cache, (&gq, 0, n_heads * hd), rows, at, with, &out)
            .unwrap();
        cmd.submit().unwrap();
        gpu.read(&out).unwrap()
    };
    let want = attend(&gpu.kv_cache(full).unwrap(), &gk);
    let small = gpu.kv_cache(keys_only).unwrap();
    // The values given to a keys-only write are not stored.
    assert_eq!(attend(&small, &junk), want);
    let bigger = gpu
        .kv_cache(KvShape {
            capacity: 16,
            ..keys_only
        })
        .unwrap();
    gpu.kv_copy(&small, &bigger, rows).unwrap();
    let out = gpu.zeros(rows * n_heads * hd).unwrap();
    let mut cmd = gpu.commands();
    cmd.attention_rows_with(&bigger, (&gq, 0, n_heads * hd), rows, at, with, &out)
        .unwrap();
    cmd.submit().unwrap();
    assert_eq!(gpu.read(&out).unwrap(), want);
    assert!(
        gpu.kv_copy(&small, &gpu.kv_cache(full).unwrap(), rows)
            .is_err()
    );
}
