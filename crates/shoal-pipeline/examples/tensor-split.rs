//! One stream's decode with a model's layers split over tensor-parallel members (issue 31, decision
//! 024) against the whole model on one member: `--members` threads, each with its own one-thread pool
//! and KV (`shoal_model::split`: its heads and feed-forward columns), adding their partial sums twice a
//! layer through real loopback lanes (`shoal_pipeline::dataplane::reduce`: sealed records, the same
//! lane code a pipeline runs); rank 0 samples and hands the token to the others through the same
//! exchange. Each round times, in turn, the whole model on 1 thread, on `--members` threads, and the
//! split; it prints tokens per second (medians over rounds), the ratios, whether the greedy tokens
//! agree, and the all-reduce's own time: per token on the split (member 0's time inside it, waits for
//! a slower member included) and with no model at all (the floor of one exchange of a hidden state).
//! A mixture-of-experts model splits by experts as well (each member a run of whole experts, the
//! router whole: `shoal_model::split`); the shares printed say who holds what. Where the output head
//! is split by vocabulary (`Share::vocab`), the floor of its logits' all-reduce is printed too.
//!
//! Members are threads of one process, not processes on machines: they share this machine's memory
//! bus as two nodes on it would, and their lanes are real loopback TCP connections.
//!
//! usage: cargo run --release -p shoal-pipeline --example tensor-split -- MODEL.gguf [--members 2]
//!        [--weights 1,1] [--tokens 32] [--rounds 5]   (`--weights`: each member's share, their count the
//!        members) [--shard-merge]   (`--shard-merge`: a head split by vocabulary merged by each
//!        member's best logit, `run_split_shard`, instead of an all-reduce of whole logit rows)

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use shoal_kernels::ThreadPool;
use shoal_model::gguf::GgufFile;
use shoal_model::split::shares;
use shoal_model::{DecoderStage, KvCache, LayerRange, ModelConfig, Pool, SeqChunk, StageInput};
use shoal_pipeline::dataplane::reduce::AllReduce;

const PROMPT: [u32; 6] = [1, 504, 3575, 282, 4649, 314];

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// One forward pass of `tokens` over `kv`: the last position's logits.
fn step(s: &DecoderStage, kv: &mut KvCache, tokens: &[u32]) -> Vec<f32> {
    let mut chunk = [SeqChunk {
        kv,
        len: tokens.len(),
        want_logits: true,
        pool: Pool::None,
    }];
    s.forward(StageInput::Tokens(tokens), &mut chunk)
        .expect("forward")
        .into_data()
}

/// Greedy decode of `n` tokens on the whole stage: the tokens and the seconds per decoded token.
fn whole(s: &DecoderStage, n: usize) -> (Vec<u32>, f64) {
    let mut kv = s.new_kv_cache();
    let mut next = argmax(&step(s, &mut kv, &PROMPT));
    let mut out = vec![next];
    let t = Instant::now();
    for _ in 1..n {
        next = argmax(&step(s, &mut kv, &[next]));
        out.push(next);
    }
    (out, t.elapsed().as_secs_f64() / (n - 1) as f64)
}

/// The same on the split members: the tokens, seconds per decoded token, and each member's time in
/// the all-reduce per decoded token (waits for a slower member included).
fn split(
    members: &[DecoderStage],
    group: &mut [AllReduce],
    n: usize,
    dim: usize,
) -> (Vec<u32>, f64, Vec<f64>) {
    let results: Vec<(Vec<u32>, f64, f64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .iter()
            .zip(group.iter_mut())
            .map(|(m, ex)| {
                scope.spawn(move || {
                    let mut kv = m.new_kv_cache();
                    let mut next = member_step(m, ex, &mut kv, &PROMPT, dim);
                    let mut out = vec![next];
                    let spent0 = ex.spent().0;
                    let t = Instant::now();
                    for _ in 1..n {
                        next = member_step(m, ex, &mut kv, &[next], dim);
                        out.push(next);
                    }
                    let per = t.elapsed().as_secs_f64() / (n - 1) as f64;
                    let reduce = (ex.spent().0 - spent0).as_secs_f64() / (n - 1) as f64;
                    (out, per, reduce)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("member"))
            .collect()
    });
    let reduces = results.iter().map(|r| r.2).collect();
    let (tokens, per, _) = results.into_iter().next().expect("rank 0");
    (tokens, per, reduces)
}

/// One forward pass of `tokens` over `kv` on member `m`, its partial sums made whole through `ex`:
/// `run_split`'s output, or with `shard` `run_split_shard`'s (its own rows of a split head's logits).
fn member_run(
    m: &DecoderStage,
    ex: &mut AllReduce,
    kv: &mut KvCache,
    tokens: &[u32],
    dim: usize,
    shard: bool,
) -> Vec<f32> {
    let mut chunk = [SeqChunk {
        kv,
        len: tokens.len(),
        want_logits: true,
        pool: Pool::None,
    }];
    let mut reduce = |p: &mut [f32]| {
        ex.reduce(p, dim)
            .map_err(|e| shoal_model::ModelError::BadInput(e.to_string()))
    };
    let input = StageInput::Tokens(tokens);
    let out = if shard {
        m.run_split_shard(input, &mut chunk, &mut reduce, None)
    } else {
        m.run_split(input, &mut chunk, &mut reduce, None)
    };
    out.expect("member").main.into_data()
}

/// One forward pass of `tokens` on member `m`; rank 0 samples and the others learn the token through
/// the same exchange.
fn member_step(
    m: &DecoderStage,
    ex: &mut AllReduce,
    kv: &mut KvCache,
    tokens: &[u32],
    dim: usize,
) -> u32 {
    let shard = SHARDS.load(Ordering::Relaxed);
    let logits = member_run(m, ex, kv, tokens, dim, shard);
    if shard {
        return merge_best(m, ex, &logits);
    }
    let mut token = [if ex.rank() == 0 {
        argmax(&logits) as f32
    } else {
        0.0
    }];
    ex.reduce(&mut token, 1).expect("token");
    token[0] as u32
}

/// `--shard-merge`: members of a head split by vocabulary return their own rows' logits
/// (`run_split_shard`) and merge them for greedy by exchanging each one's best (value, id) — a few
/// floats instead of the whole vocabulary-wide row.
static SHARDS: AtomicBool = AtomicBool::new(false);

/// The greedy token of a head split by vocabulary: every member's best of its `logits` exchanged,
/// the largest wins (the first on a tie, as `argmax`).
fn merge_best(m: &DecoderStage, ex: &mut AllReduce, logits: &[f32]) -> u32 {
    let share = m.share().expect("a member");
    // Slot r: member r's best logit and its id (zeros elsewhere: the sum gathers every slot).
    let mut best = vec![0f32; 2 * share.members];
    best[2 * share.rank] = f32::NEG_INFINITY;
    if !logits.is_empty() {
        let i = argmax(logits) as usize;
        best[2 * share.rank] = logits[i];
        best[2 * share.rank + 1] = (share.vocab.start + i) as f32;
    }
    let width = best.len();
    ex.reduce(&mut best, width).expect("token");
    let mut pick = (f32::NEG_INFINITY, 0u32);
    for slot in best.chunks_exact(2) {
        if slot[0] > pick.0 {
            pick = (slot[0], slot[1] as u32);
        }
    }
    pick.1
}

/// The prompt's last logits on the split members (rank 0's).
fn split_prefill(members: &[DecoderStage], group: &mut [AllReduce], dim: usize) -> Vec<f32> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .iter()
            .zip(group.iter_mut())
            .map(|(m, ex)| {
                scope.spawn(move || {
                    let mut kv = m.new_kv_cache();
                    member_run(m, ex, &mut kv, &PROMPT, dim, false)
                })
            })
            .collect();
        let mut outs: Vec<Vec<f32>> = handles
            .into_iter()
            .map(|h| h.join().expect("member"))
            .collect();
        outs.swap_remove(0)
    })
}

/// `max |Δ| / max |a|`, and the gap between `a`'s two largest over its largest magnitude.
fn distance(a: &[f32], b: &[f32]) -> (f32, f32) {
    let top = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    let mut s = a.to_vec();
    s.sort_by(|x, y| y.total_cmp(x));
    (d / top, (s[0] - s[1]) / top)
}

/// Microseconds one all-reduce of a `dim`-wide row takes with nothing else running (median of 2,000).
fn floor_us(group: &mut [AllReduce], dim: usize) -> f64 {
    let mut times: Vec<f64> = std::thread::scope(|scope| {
        let handles: Vec<_> = group
            .iter_mut()
            .map(|ex| {
                scope.spawn(move || {
                    let mut row = vec![1.0f32; dim];
                    (0..2000)
                        .map(|_| {
                            let t = Instant::now();
                            ex.reduce(&mut row, dim).expect("reduce");
                            t.elapsed().as_secs_f64() * 1e6
                        })
                        .collect::<Vec<f64>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .next()
            .map(|h| h.join().expect("member"))
            .unwrap_or_default()
    });
    median(&mut times)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next().map(PathBuf::from) else {
        eprintln!("usage: tensor-split MODEL.gguf [--members 2] [--tokens 32] [--rounds 5]");
        std::process::exit(2)
    };
    let (mut n_members, mut tokens, mut rounds) = (2usize, 32usize, 5usize);
    let mut weights: Option<Vec<f64>> = None;
    while let Some(flag) = args.next() {
        if flag == "--shard-merge" {
            SHARDS.store(true, Ordering::Relaxed);
            continue;
        }
        if flag == "--weights" {
            weights = args
                .next()
                .map(|v| v.split(',').filter_map(|w| w.parse().ok()).collect());
            continue;
        }
        let value: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            eprintln!("bad value for {flag}");
            std::process::exit(2)
        });
        match flag.as_str() {
            "--members" => n_members = value,
            "--tokens" => tokens = value.max(2),
            "--rounds" => rounds = value.max(1),
            _ => {
                eprintln!("unknown flag {flag}");
                std::process::exit(2)
            }
        }
    }
    let mut g = GgufFile::open(&path).expect("open model");
    let cfg = ModelConfig::from_gguf(&g).expect("config");
    let range = LayerRange::full(cfg.n_layers);
    let one = Arc::new(ThreadPool::new(1));
    let whole1 = DecoderStage::load(&mut g, range, &one).expect("load");
    let wholen =
        DecoderStage::load(&mut g, range, &Arc::new(ThreadPool::new(n_members))).expect("load");
    let weights = weights.unwrap_or_else(|| vec![1.0; n_members]);
    let n_members = weights.len();
    let cut = shares(&mut g, &cfg, range, &weights).expect("split");
    let members: Vec<DecoderStage> = cut
        .iter()
        .map(|s| {
            DecoderStage::load_share(&mut g, range, s, &Arc::new(ThreadPool::new(1)))
                .expect("load share")
        })
        .collect();
    let mut group = AllReduce::loopback(n_members).expect("lanes");
    println!(
        "{}: {} layers, dim {}; shares {:?}",
        path.display(),
        cfg.n_layers,
        cfg.dim,
        cut
    );
    let want = step(&whole1, &mut whole1.new_kv_cache(), &PROMPT);
    let got = split_prefill(&members, &mut group, cfg.dim);
    let (d, margin) = distance(&want, &got);
    println!(
        "prompt's last logits, split vs whole: max |Δ| {d:.2e} of the largest; the whole's top two {margin:.2e} apart; argmax {} vs {}",
        argmax(&want),
        argmax(&got)
    );
    let (mut t1, mut tn, mut ts, mut tr) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut agree = true;
    for r in 0..rounds {
        let (a, a_t) = whole(&whole1, tokens);
        let (b, b_t) = whole(&wholen, tokens);
        let (c, c_t, c_rs) = split(&members, &mut group, tokens, cfg.dim);
        let c_r = c_rs[0];
        agree &= a == b && a == c;
        let parted = |x: &[u32]| match a.iter().zip(x).position(|(p, q)| p != q) {
            Some(i) => format!(" from token {i}"),
            None => String::new(),
        };
        let others: Vec<String> = c_rs.iter().map(|t| format!("{:.0}", t * 1e6)).collect();
        println!(
            "round {r}: whole 1 thread {:.1} tok/s, whole {n_members} threads {:.1}, split {n_members} x 1 {:.1} (all-reduce us/token by rank: {}){}",
            1.0 / a_t,
            1.0 / b_t,
            1.0 / c_t,
            others.join(" / "),
            if a == c {
                String::new()
            } else {
                format!("  [split tokens differ{}]", parted(&c))
            }
        );
        t1.push(1.0 / a_t);
        tn.push(1.0 / b_t);
        ts.push(1.0 / c_t);
        tr.push(c_r * 1e6);
    }
    let floor = floor_us(&mut group, cfg.dim);
    // A split head's logits are made whole by one all-reduce of a vocabulary-wide row.
    let head_split = cut.iter().filter(|s| !s.vocab.is_empty()).count() > 1;
    let logits_floor = head_split.then(|| floor_us(&mut group, cfg.vocab_size));
    let (m1, mn, ms, mr) = (
        median(&mut t1),
        median(&mut tn),
        median(&mut ts),
        median(&mut tr),
    );
    println!(
        "medians: whole 1 thread {m1:.1} tok/s, whole {n_members} threads {mn:.1}, split {n_members} x 1 thread {ms:.1}: \
         {:.2}x one thread, {:.2}x {n_members} threads; all-reduce {mr:.0} us/token on the split ({} exchanges), \
         {floor:.1} us each with no model; greedy tokens {}",
        ms / m1,
        ms / mn,
        2 * cfg.n_layers + 1 + usize::from(head_split && !SHARDS.load(Ordering::Relaxed)),
        if agree {
            "agree"
        } else {
            "differ in some round"
        }
    );
    if let Some(us) = logits_floor {
        println!(
            "the head is split by vocabulary: one all-reduce of a {}-wide logits row takes {us:.1} us with no model",
            cfg.vocab_size
        );
    }
}
