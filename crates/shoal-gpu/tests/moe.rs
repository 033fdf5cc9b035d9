//! The mixture-of-experts kernels against host computations: the id-indexed matrix-vector product
//! (every format, stacked experts chunked at expert boundaries, expert biases, shared or per-pair
//! input rows), the device routing (each gating, selection bias, renormalisation, scale, ties,
//! group-limited top-k) and
//! the weighted combination with a shared expert. They fail with no adapter unless
//! `SHOAL_GPU_TESTS=skip`.

mod common;

use common::{gpu, gpu_with, matvec_reference, random_matrix, random_vec};
use shoal_gpu::{GPU_TYPES, Gpu, GpuError, MoeGating, MoeRouting, OpenOptions};
use shoal_kernels::{QK, QMatrix, QType, row_bytes};
use shoal_testkit::rng::{Draw, SplitMix64};

/// Ids as the u32 bit patterns the kernels read from a `GpuVec`.
fn upload_ids(gpu: &Gpu, ids: &[u32]) -> shoal_gpu::GpuVec {
    let bits: Vec<f32> = ids.iter().map(|&i| f32::from_bits(i)).collect();
    gpu.upload(&bits).unwrap()
}

/// `experts` random experts of `per × cols`, `tokens` tokens of `slots` ids each: every pair's
/// output against the f64 product with its expert (tolerance as `kernels.rs`'s matvec:
/// `1e-5 · Σ|w·x| + 1e-6`), plus the expert's bias row when `with_bias`.
#[allow(clippy::too_many_arguments)] // the shape of the problem
fn check_matvec_id(
    gpu: &Gpu,
    qtype: QType,
    (experts, per, cols): (usize, usize, usize),
    (tokens, slots): (usize, usize),
    per_pair_rows: bool,
    with_bias: bool,
    seed: u64,
) -> usize {
    let mut rng = SplitMix64::new(seed);
    let bytes = random_matrix(&mut rng, qtype, experts * per, cols);
    let stacked = QMatrix::new(qtype, experts * per, cols, &bytes).unwrap();
    let g = gpu.upload_experts(&stacked, experts).unwrap();
    assert_eq!(g.experts(), experts);
    let pairs = tokens * slots;
    let ids: Vec<u32> = (0..pairs)
        .map(|_| rng.below(experts as u64) as u32)
        .collect();
    let x_rows = if per_pair_rows { pairs } else { tokens };
    let x = random_vec(&mut rng, x_rows * cols, -1.0, 1.0);
    let bias = random_vec(&mut rng, experts * per, -1.0, 1.0);
    let gbias = gpu.upload(&bias).unwrap();
    let (gx, gids, gy) = (
        gpu.upload(&x).unwrap(),
        upload_ids(gpu, &ids),
        gpu.zeros(pairs * per).unwrap(),
    );
    let x_div = if per_pair_rows { 1 } else { slots };
    let mut cmd = gpu.commands();
    cmd.matvec_id(&g, with_bias.then_some(&gbias), &gx, x_div, &gids, &gy)
        .unwrap();
    cmd.submit().unwrap();
    let y = gpu.read(&gy).unwrap();
    let rb = row_bytes(qtype, cols);
    for (p, &e) in ids.iter().enumerate() {
        let e = e as usize;
        let w = QMatrix::new(qtype, per, cols, &bytes[e * per * rb..(e + 1) * per * rb]).unwrap();
        let xr = &x[(p / x_div) * cols..(p / x_div + 1) * cols];
        let (exact, mag) = matvec_reference(&w, xr);
        for r in 0..per {
            let b = if with_bias { bias[e * per + r] } else { 0.0 };
            let want = exact[r] + f64::from(b);
            let err = (f64::from(y[p * per + r]) - want).abs();
            let tol = 1e-5 * (mag[r] + f64::from(b.abs())) + 1e-6;
            assert!(
                err <= tol,
                "{} pair {p} (expert {e}) row {r}: gpu {} exact {want} (err {err:e})",
                qtype.name(),
                y[p * per + r]
            );
        }
    }
    g.chunks()
}

#[test]
fn id_indexed_matvec_multiplies_each_pair_by_its_expert_in_every_format() {
    let Some(gpu) = gpu() else { return };
    for (i, &qtype) in GPU_TYPES.iter().enumerate() {
        let cols = match qtype.block_size() {
            1 => 36,
            QK => 64,
            _ => 256,
        };
        let seed = 300 + i as u64;
        check_matvec_id(&gpu, qtype, (4, 5, cols), (3, 2), false, i % 2 == 0, seed);
        check_matvec_id(
            &gpu,
            qtype,
            (3, 3, cols),
            (2, 3),
            true,
            i % 2 == 1,
            seed + 50,
        );
    }
}

#[test]
fn stacked_experts_are_chunked_only_between_experts() {
    let Some(gpu) = gpu_with(OpenOptions {
        max_binding: Some(4096),
    }) else {
        return;
    };
    // Q8_0 rows of 64 are 64 bytes of quants: 64 rows fit a chunk, so experts of 12 rows go five
    // to a chunk (60 rows), never split.
    let chunks = check_matvec_id(&gpu, QType::Q8_0, (11, 12, 64), (5, 2), false, true, 7);
    assert_eq!(chunks, 3, "11 experts, 5 to a chunk");
    // One expert above a binding is refused.
    let bytes = vec![0u8; row_bytes(QType::F32, 64) * 40];
    let err = gpu
        .upload_experts(&QMatrix::new(QType::F32, 40, 64, &bytes).unwrap(), 2)
        .unwrap_err();
    assert!(
        matches!(
            err,
            GpuError::TooLarge {
                what: "one expert",
                ..
            }
        ),
        "{err}"
    );
    let err = gpu
        .upload_experts(&QMatrix::new(QType::F32, 40, 64, &bytes).unwrap(), 3)
        .unwrap_err();
    assert!(matches!(err, GpuError::Shape(_)), "{err}");
}

/// The host's routing rules (shoal-model's `ffn::route`, written out again): the chosen ids in
/// order and their weights.
fn host_route(logits: &[f32], bias: Option<&[f32]>, r: MoeRouting) -> Vec<(u32, f32)> {
    let mut l = logits.to_vec();
    let softmax = |v: &mut [f32]| {
        let m = v.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut sum = 0f32;
        for x in v.iter_mut() {
            *x = (*x - m).exp();
            sum += *x;
        }
        v.iter_mut().for_each(|x| *x /= sum);
    };
    match r.gating {
        MoeGating::SoftmaxThenTopK => softmax(&mut l),
        MoeGating::Sigmoid => l.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())),
        MoeGating::TopKThenSoftmax => {}
    }
    let select = |e: usize| l[e] + bias.map_or(0.0, |b| b[e]);
    // Group-limited: the groups whose two best scores sum highest, first group on a tie.
    let (groups, used) = r.groups;
    let per = l.len() / groups.max(1);
    let open: Vec<bool> = if groups > 1 && used < groups {
        let group_score = |g: usize| {
            let mut s: Vec<f32> = (g * per..(g + 1) * per).map(select).collect();
            s.sort_by(|a, b| b.total_cmp(a));
            s.iter().take(2).sum::<f32>()
        };
        let mut order: Vec<usize> = (0..groups).collect();
        order.sort_by(|&a, &b| group_score(b).total_cmp(&group_score(a)).then(a.cmp(&b)));
        (0..l.len())
            .map(|e| order[..used].contains(&(e / per)))
            .collect()
    } else {
        vec![true; l.len()]
    };
    let mut chosen: Vec<usize> = Vec::new();
    for _ in 0..r.used {
        let best = (0..l.len())
            .filter(|&e| open[e] && !chosen.contains(&e))
            .fold(None, |best: Option<usize>, e| match best {
                Some(b) if select(e) <= select(b) => Some(b),
                _ => Some(e),
            })
            .unwrap();
        chosen.push(best);
    }
    let mut w: Vec<f32> = chosen.iter().map(|&e| l[e]).collect();
    if r.gating == MoeGating::TopKThenSoftmax {
        softmax(&mut w);
    }
    let total: f32 = w.iter().sum();
    let scale = match r.norm_weights {
        true => r.scale / total.max(6.103_515_6e-5),
        false => r.scale,
    };
    chosen
        .iter()
        .zip(w)
        .map(|(&e, w)| (e as u32, w * scale))
        .collect()
}

#[test]
fn device_routing_chooses_the_host_s_experts_and_weights() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(41);
    let (tokens, n) = (70, 12);
    let mut logits = random_vec(&mut rng, tokens * n, -3.0, 3.0);
    // Ties: token 0's logits all equal (the first indices win), token 1's best two equal.
    logits[..n].fill(0.5);
    logits[n + 3] = 4.0;
    logits[n + 7] = 4.0;
    let bias = random_vec(&mut rng, n, -0.5, 0.5);
    let cases = [
        (MoeGating::SoftmaxThenTopK, true, 1.0, false, 4, (0, 0)),
        (MoeGating::SoftmaxThenTopK, false, 1.0, false, 2, (0, 0)),
        (MoeGating::TopKThenSoftmax, false, 1.0, false, 3, (0, 0)),
        (MoeGating::Sigmoid, true, 2.5, true, 4, (0, 0)),
        (MoeGating::Sigmoid, false, 1.0, true, 1, (0, 0)),
        (MoeGating::SoftmaxThenTopK, true, 1.0, false, 12, (0, 0)),
        // Group-limited (DeepSeek V3): 4 groups of 3, the best 2 (or 1) open; all 4: no limit.
        (MoeGating::Sigmoid, true, 2.5, true, 3, (4, 2)),
        (MoeGating::SoftmaxThenTopK, false, 1.0, false, 2, (4, 1)),
        (MoeGating::Sigmoid, true, 1.0, true, 4, (4, 4)),
    ];
    for (gating, norm_weights, scale, with_bias, used, groups) in cases {
        let r = MoeRouting {
            experts: n,
            used,
            gating,
            norm_weights,
            scale,
            groups,
        };
        let gl = gpu.upload(&logits).unwrap();
        let gb = gpu.upload(&bias).unwrap();
        let (ids, weights) = (
            gpu.zeros(tokens * used).unwrap(),
            gpu.zeros(tokens * used).unwrap(),
        );
        let mut cmd = gpu.commands();
        cmd.moe_route(&gl, with_bias.then_some(&gb), r, &ids, &weights)
            .unwrap();
        cmd.submit().unwrap();
        let got_ids: Vec<u32> = gpu
            .read(&ids)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        let got_w = gpu.read(&weights).unwrap();
        for t in 0..tokens {
            let row = &logits[t * n..(t + 1) * n];
            let mut want = host_route(row, with_bias.then_some(&bias[..]), r);
            want.sort_by_key(|p| p.0);
            let case = format!("{gating:?} norm {norm_weights} k {used} {groups:?} token {t}");
            let got: Vec<u32> = got_ids[t * used..(t + 1) * used].to_vec();
            assert_eq!(got, want.iter().map(|p| p.0).collect::<Vec<_>>(), "{case}");
            for (s, &(_, w)) in want.iter().enumerate() {
                let g = got_w[t * used + s];
                assert!(
                    (g - w).abs() <= 2e-6 * w.abs().max(1.0),
                    "{case}: {g} vs {w}"
                );
            }
        }
        if used == 4 && gating == MoeGating::SoftmaxThenTopK {
            assert_eq!(
                &got_ids[..4],
                [0, 1, 2, 3],
                "a tie goes to the first experts"
            );
            let t1 = &got_ids[4..8];
            assert!(
                t1.contains(&3) && t1.contains(&7),
                "the tied best two: {t1:?}"
            );
        }
    }
    let mut cmd = gpu.commands();
    let z = gpu.zeros(n).unwrap();
    let r = MoeRouting {
        experts: n,
        used: 13,
        gating: MoeGating::Sigmoid,
        norm_weights: false,
        scale: 1.0,
        groups: (0, 0),
    };
    assert!(
        cmd.moe_route(&z, None, r, &z, &z).is_err(),
        "k above the experts"
    );
    let r = MoeRouting {
        used: 2,
        groups: (5, 2),
        ..r
    };
    let why = "groups not dividing the experts";
    assert!(cmd.moe_route(&z, None, r, &z, &z).is_err(), "{why}");
}

#[test]
fn combination_weights_the_slots_and_adds_the_shared_expert() {
    let Some(gpu) = gpu() else { return };
    let mut rng = SplitMix64::new(5);
    let (tokens, k, dim) = (3, 2, 10);
    let y = random_vec(&mut rng, tokens * k * dim, -1.0, 1.0);
    let w = random_vec(&mut rng, tokens * k, 0.0, 1.0);
    let sh = random_vec(&mut rng, tokens * dim, -1.0, 1.0);
    let gate = random_vec(&mut rng, tokens, -2.0, 2.0);
    let (gy, gw, gsh, gg) = (
        gpu.upload(&y).unwrap(),
        gpu.upload(&w).unwrap(),
        gpu.upload(&sh).unwrap(),
        gpu.upload(&gate).unwrap(),
    );
    for mode in 0..3 {
        let out = gpu.zeros(tokens * dim).unwrap();
        let shared = match mode {
            0 => None,
            1 => Some((&gsh, None)),
            _ => Some((&gsh, Some(&gg))),
        };
        let mut cmd = gpu.commands();
        cmd.moe_combine(&gy, &gw, shared, dim, &out).unwrap();
        cmd.submit().unwrap();
        let got = gpu.read(&out).unwrap();
        for t in 0..tokens {
            for d in 0..dim {
                let mut want = 0f32;
                for s in 0..k {
                    want += w[t * k + s] * y[(t * k + s) * dim + d];
                }
                let g = match mode {
                    0 => 0.0,
                    1 => 1.0,
                    _ => 1.0 / (1.0 + (-gate[t]).exp()),
                };
                want += g * sh[t * dim + d];
                let i = t * dim + d;
                assert!((got[i] - want).abs() <= 1e-6, "mode {mode} [{t}, {d}]");
            }
        }
    }
}
