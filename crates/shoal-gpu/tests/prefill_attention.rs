//! Causal attention of a prefill chunk (`Commands::attention_rows`, keys and values written with
//! `Commands::kv_write_rows` from fused QKV rows) against shoal-kernels' `attend_f16` per row (as
//! shoal-model's CPU attention computes a chunk), an f64 softmax, and the GPU's own decode
//! attention at each row's position.
//!
//! Tolerances as `common::check_attention` states (1e-3 of `Σ_j |p_j · v_j|` against
//! `attend_f16`, 2e-3 against the f64 softmax); bitwise against decode attention (the same kernel
//! per row).

mod common;

use common::{HEAD_LAYOUTS, check_attention, gpu, kv_shape_of, random_vec};
use half::f16;
use shoal_gpu::{Attend, KvShape};
use shoal_testkit::rng::SplitMix64;

/// `(layer, first position, rows, window, query scale)`.
type Case = (usize, usize, usize, usize, Option<f32>);

const CASES: [Case; 9] = [
    (0, 0, 1, 0, None),
    (1, 0, 3, 0, None),
    (0, 0, 16, 0, Some(0.125)),
    (1, 5, 3, 0, None),
    (0, 7, 1, 0, Some(0.3)),
    (1, 20, 16, 0, None),
    (0, 24, 16, 5, None),
    (1, 10, 3, 1, None),
    (0, 0, 16, 4, Some(0.2)),
];

#[test]
fn prefill_attention_matches_the_cpu_per_row() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(47);
    let r16 = |v: f32| f16::from_f32(v).to_f32();
    for layout in HEAD_LAYOUTS {
        let (n_heads, n_kv, hd) = layout;
        let shape = kv_shape_of(layout);
        let cache = gpu.kv_cache(shape).unwrap();
        let (qd, kvd) = (n_heads * hd, n_kv * hd);
        // A fused QKV row, as the QKV matmat writes it: [q | k | v].
        let row = qd + 2 * kvd;
        for (layer, p0, n, window, query_scale) in CASES {
            let end = p0 + n;
            // The prefix 0..p0 from plain k and v vectors (stride kvd), then the chunk's fused rows
            // (from offset 3, as from inside a larger buffer).
            let pk = random_vec(&mut rng, p0 * kvd + 1, -2.0, 2.0);
            let pv = random_vec(&mut rng, p0 * kvd + 1, -2.0, 2.0);
            let qkv = random_vec(&mut rng, 3 + n * row, -2.0, 2.0);
            let (gpk, gpv) = (gpu.upload(&pk).unwrap(), gpu.upload(&pv).unwrap());
            let gqkv = gpu.upload(&qkv).unwrap();
            let out = gpu.zeros(n * qd).unwrap();
            let mut cmds = gpu.commands();
            cmds.kv_write_rows(&cache, layer, 0, p0, &gpk, 0, &gpv, 0, kvd)
                .unwrap();
            cmds.kv_write_rows(
                &cache,
                layer,
                p0,
                n,
                &gqkv,
                3 + qd,
                &gqkv,
                3 + qd + kvd,
                row,
            )
            .unwrap();
            let at = Attend {
                layer,
                pos: p0,
                window,
                query_scale,
            };
            cmds.attention_rows(&cache, &gqkv, 3, row, n, at, &out)
                .unwrap();
            cmds.submit().unwrap();
            let y = gpu.read(&out).unwrap();

            // Decode attention at each row's position, over the same cache.
            let one = gpu.zeros(qd).unwrap();
            for i in 0..n {
                let mut cmds = gpu.commands();
                let at = Attend { pos: p0 + i, ..at };
                cmds.attention(&cache, &gqkv, 3 + i * row, at, &one)
                    .unwrap();
                cmds.submit().unwrap();
                let d = gpu.read(&one).unwrap();
                assert!(
                    d.iter()
                        .zip(&y[i * qd..(i + 1) * qd])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{n_heads}/{n_kv}×{hd} case {layer} {p0} {n} {window}: row {i} differs from \
                     decode attention"
                );
            }

            // Host f16 keys and values [pos][kv_head][hd].
            let (mut hk, mut hv) = (vec![0f32; end * kvd], vec![0f32; end * kvd]);
            for i in 0..p0 * kvd {
                hk[i] = r16(pk[i]);
                hv[i] = r16(pv[i]);
            }
            for i in 0..n {
                for c in 0..kvd {
                    hk[(p0 + i) * kvd + c] = r16(qkv[3 + i * row + qd + c]);
                    hv[(p0 + i) * kvd + c] = r16(qkv[3 + i * row + qd + kvd + c]);
                }
            }
            let (qs, scale) = match query_scale {
                Some(s) => (s, 1.0),
                None => (1.0, 1.0 / (hd as f32).sqrt()),
            };
            let group = n_heads / n_kv;
            for i in 0..n {
                let len = p0 + i + 1;
                let first = if window == 0 {
                    0
                } else {
                    len.saturating_sub(window)
                };
                let qr: Vec<f32> = qkv[3 + i * row..][..qd]
                    .iter()
                    .map(|&v| r16(v * qs))
                    .collect();
                for g in 0..n_kv {
                    let gather = |h: &[f32]| -> Vec<f16> {
                        (first..len)
                            .flat_map(|j| &h[j * kvd + g * hd..][..hd])
                            .map(|&v| f16::from_f32(v))
                            .collect()
                    };
                    let (keys, vals) = (gather(&hk), gather(&hv));
                    let qg = &qr[g * group * hd..(g + 1) * group * hd];
                    let got = &y[i * qd + g * group * hd..][..group * hd];
                    let ctx = format!(
                        "{n_heads}/{n_kv}×{hd} layer {layer} p0 {p0} rows {n} window {window} \
                         row {i} kv head {g}"
                    );
                    check_attention(qg, group, &keys, &vals, hd, scale, got, &ctx);
                }
            }
        }
    }
}

/// Chunks past the cache, short query or output vectors, and a scratch above the storage
/// binding are refused with an error, never a panic or a device fault.
#[test]
fn prefill_attention_refuses_bad_shapes() {
    use shoal_gpu::{GpuError, OpenOptions};
    let Some(gpu) = common::gpu_with(OpenOptions {
        max_binding: Some(64 * 1024),
    }) else {
        return;
    };
    let shape = KvShape {
        layers: 1,
        capacity: 200,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 8,
        keys_only: false,
    };
    let cache = gpu.kv_cache(shape).unwrap();
    let at = |pos| Attend {
        layer: 0,
        pos,
        window: 0,
        query_scale: None,
    };
    let q = gpu.zeros(200 * 16).unwrap();
    let out = gpu.zeros(100 * 16).unwrap();
    let mut cmds = gpu.commands();
    // Positions 150..250 exceed the capacity of 200.
    assert!(matches!(
        cmds.attention_rows(&cache, &q, 0, 16, 100, at(150), &out),
        Err(GpuError::Shape(_))
    ));
    // The last row's query would read past q.
    assert!(matches!(
        cmds.attention_rows(&cache, &q, 17, 32, 100, at(0), &out),
        Err(GpuError::Shape(_))
    ));
    // 100 rows × 2 heads × 200 keys × 4 bytes = 160 KB of scores: above the 64 KiB binding.
    assert!(matches!(
        cmds.attention_rows(&cache, &q, 0, 16, 100, at(100), &out),
        Err(GpuError::TooLarge { .. })
    ));
    assert!(matches!(
        cmds.kv_write_rows(&cache, 0, 190, 20, &q, 0, &q, 8, 16),
        Err(GpuError::Shape(_))
    ));
}
