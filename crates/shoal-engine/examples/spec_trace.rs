//! Speculative decoding, traced on a real model: where n-gram drafts are rejected and what a
//! verifying pass costs.
//!
//! 1. Greedy output of `scripts/bench-speculative`'s prompts (`edit`, `chat`; `--text` for a base
//!    model) with speculation off and on, checked equal, with each run's decode rate.
//! 2. The drafts replayed over that output (greedy output does not depend on the drafts, so every
//!    pass is known): each pass's draft, what was accepted, the token that broke it.
//! 3. What a pass of `t` rows costs on the model's last stage (all layers here), with logits for
//!    every row (a verifying pass), for the last row only, and with none, against a 1-row step.
//!
//! `cargo run --release -p shoal-engine --example spec_trace -- MODEL.gguf [--text] [-n 128]
//! [--threads 2] [--trace] [--max-draft 8]`

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use shoal_engine::draft::{Adapt, DraftSource, NgramDraft, Proposal, WINDOW};
use shoal_engine::engine::{EngineConfig, load_local_stage, spawn_from_gguf};
use shoal_engine::sampler::Sampler;
use shoal_engine::stage::{ChunkSpec, KvOp, LocalStage, Pool, SampleRef, Stage, StageData};
use shoal_engine::{ChatMessage, EngineHandle, Event, GenerateRequest, Prompt, Speculation};
use shoal_kernels::ThreadPool;
use shoal_model::LayerRange;

const FUNCTION: &str = r#"def moving_average(values, window):
    """Average of each window of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
"#;

struct Args {
    model: PathBuf,
    text: bool,
    n: u32,
    threads: usize,
    trace: bool,
    max_draft: usize,
    cost: bool,
}

fn args() -> Args {
    let mut a = Args {
        model: PathBuf::new(),
        text: false,
        n: 128,
        threads: 2,
        trace: false,
        max_draft: 8,
        cost: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(s) = it.next() {
        let mut num = || it.next().and_then(|v| v.parse().ok()).expect("a number");
        match s.as_str() {
            "--text" => a.text = true,
            "--trace" => a.trace = true,
            "--no-cost" => a.cost = false,
            "-n" => a.n = num() as u32,
            "--threads" => a.threads = num(),
            "--max-draft" => a.max_draft = num(),
            path => a.model = path.into(),
        }
    }
    a
}

/// The prompt text of `name` as `scripts/bench-speculative` sends it.
fn prompt(engine: &EngineHandle, name: &str, text: bool) -> String {
    let edit = format!(
        "Here is a Python function:\n\n```python\n{FUNCTION}```\n\nRewrite it with the variable \
         `total` renamed to `running`. Reply with the whole function only."
    );
    match (name, text) {
        ("edit", false) => engine
            .render_chat(&[ChatMessage::new("user", edit)])
            .expect("chat template"),
        ("chat", false) => engine
            .render_chat(&[ChatMessage::new(
                "user",
                "Tell me about the history of the city of Lyon.",
            )])
            .expect("chat template"),
        ("edit", true) => format!(
            "Here is a Python function:\n\n```python\n{FUNCTION}```\n\nThe same function with the \
             variable `total` renamed to `running`:\n\n```python\n"
        ),
        _ => "The history of the city of Lyon, France, begins".into(),
    }
}

/// Greedy output ids of `prompt` and its decode rate (tokens after the first over the time since it).
fn generate(engine: &EngineHandle, prompt: &str, n: u32, spec: Speculation) -> (Vec<u32>, f64) {
    let mut req = GenerateRequest {
        model: "m".into(),
        prompt: Prompt::Text(prompt.into()),
        sampling: Default::default(),
        max_tokens: std::num::NonZeroU32::new(n),
        stop: Vec::new(),
        add_bos: true,
        ignore_eos: false,
        timeout: None,
        logits_processor: None,
        speculative: Some(spec),
    };
    req.sampling.temperature = 0.0;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut stream = engine.submit(req).expect("submit");
    rt.block_on(async {
        use std::future::poll_fn;
        let (mut ids, mut first, mut last) = (Vec::new(), None, None);
        while let Some(ev) = poll_fn(|cx| stream.poll_next(cx)).await {
            match ev {
                Event::Token { id, .. } => {
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = Some(now);
                    ids.push(id);
                }
                Event::Done { .. } => break,
                Event::Error(e) => panic!("{e}"),
            }
        }
        let secs = match (first, last) {
            (Some(f), Some(l)) => (l - f).as_secs_f64(),
            _ => 0.0,
        };
        let rate = (ids.len().saturating_sub(1)) as f64 / secs.max(1e-9);
        (ids, rate)
    })
}

/// One replayed pass: where it drafted, what, how much was accepted.
struct Pass {
    at: usize,
    draft: Vec<u32>,
    accepted: usize,
}

/// Replays `source` over `prompt` + `out` with `adapt` sizing the drafts (cost per drafted token
/// `cost`): the passes a greedy run takes.
fn replay(
    source: &mut dyn DraftSource,
    mut adapt: Adapt,
    fixed: Option<usize>,
    cost: Option<f64>,
    prompt: &[u32],
    out: &[u32],
) -> Vec<Pass> {
    let mut tokens = prompt.to_vec();
    let mut passes = Vec::new();
    let mut j = 0;
    while j < out.len() {
        let k = fixed
            .unwrap_or_else(|| adapt.next_k(cost))
            .min(out.len() - j - 1);
        let draft = if k == 0 {
            Vec::new()
        } else {
            source.propose(&tokens, k)
        };
        let accepted = draft
            .iter()
            .zip(&out[j..])
            .take_while(|(d, o)| d == o)
            .count();
        adapt.record(draft.len(), accepted);
        let took = (accepted + 1).min(out.len() - j);
        tokens.extend_from_slice(&out[j..j + took]);
        passes.push(Pass {
            at: j,
            draft,
            accepted,
        });
        j += took;
    }
    passes
}

/// Time of one call of `f`, median of `reps` after one warm-up.
fn median_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[reps / 2]
}

/// Seconds of a pass of `t` tokens after `ctx` cached ones with `rows` logits rows (0: none; 1: the
/// last; `t`: every row, verified by the greedy sampler), its KV rewound after each.
fn pass_secs(stage: &mut LocalStage, ctx: usize, fed: &[u32], rows: usize) -> f64 {
    let greedy = Sampler::new(Default::default(), 0);
    let history: Vec<u32> = Vec::new();
    median_secs(15, || {
        let chunk = [ChunkSpec {
            seq_id: 1,
            len: fed.len(),
            want_logits: rows > 0,
            pool: Pool::None,
        }];
        let draft = &fed[1..rows.max(1)];
        let job = SampleRef {
            seq_id: 1,
            sampler: &greedy,
            history: &history,
            mask: None,
            draft,
            draft_masks: &[],
        };
        let jobs = if rows > 0 { vec![job] } else { Vec::new() };
        let out = stage
            .forward(&chunk, StageData::Tokens(fed.to_vec()), &jobs)
            .expect("forward");
        drop(out);
        stage
            .kv(KvOp::Rewind {
                seq_id: 1,
                len: ctx,
            })
            .expect("rewind");
    })
}

fn main() {
    let a = args();
    let config = EngineConfig {
        threads: a.threads,
        ..Default::default()
    };
    let engine = spawn_from_gguf(&a.model, "m", config).expect("engine");
    let tok = engine.tokenizer().clone();
    let spec = Speculation::Ngram {
        max_draft: a.max_draft,
    };
    let mut edit_prompt = Vec::new();
    for name in ["edit", "chat"] {
        let text = prompt(&engine, name, a.text);
        let ids = tok.encode_prompt(&text);
        let (off, off_rate) = generate(&engine, &text, a.n, Speculation::Off);
        let before = engine.stats();
        let (on, on_rate) = generate(&engine, &text, a.n, spec);
        let after = engine.stats();
        assert_eq!(on, off, "greedy output differs with drafts");
        let (passes, drafted, accepted) = (
            after.spec_passes - before.spec_passes,
            after.drafted_tokens - before.drafted_tokens,
            after.accepted_tokens - before.accepted_tokens,
        );
        println!(
            "== {name}: prompt {} tokens, output {}; off {off_rate:.1} tok/s, ngram {on_rate:.1} \
             tok/s ({:.2}x); engine: {passes} passes, {drafted} drafted, {accepted} accepted",
            ids.len(),
            off.len(),
            on_rate / off_rate,
        );
        if name == "edit" {
            println!("output: {:?}", tok.decode(&off));
        }
        for k in [1, 2, 4, 8] {
            let adapt = Adapt::new(k);
            let p = replay(&mut NgramDraft::default(), adapt, Some(k), None, &ids, &off);
            summary(&format!("ngram k={k} fixed"), &p, off.len());
        }
        let p = replay(
            &mut NgramDraft::default(),
            Adapt::new(a.max_draft),
            None,
            None,
            &ids,
            &off,
        );
        summary("ngram adaptive (no cost)", &p, off.len());
        let p8 = replay(
            &mut NgramDraft::default(),
            Adapt::new(8),
            Some(8),
            None,
            &ids,
            &off,
        );
        buckets(&mut NgramDraft::default(), &ids, &off);
        let plain = replay(&mut Plain, Adapt::new(8), Some(8), None, &ids, &off);
        summary("plain lookup k=8 fixed (before)", &plain, off.len());
        summary("follow k=8 fixed", &p8, off.len());
        if a.trace {
            for p in &p {
                let next = off.get(p.at + p.accepted).copied();
                println!(
                    "{:4} k={} acc={} | {:?} | drafted {:?} | got {:?}",
                    p.at,
                    p.draft.len(),
                    p.accepted,
                    tok.decode(&off[p.at.saturating_sub(4)..p.at]),
                    tok.decode(&p.draft),
                    next.map(|t| tok.decode(&[t])),
                );
            }
        }
        if name == "edit" {
            edit_prompt = ids;
        }
    }
    drop(engine);
    if !a.cost {
        return;
    }
    // What a pass costs, at the edit prompt's context.
    let pool = Arc::new(ThreadPool::new(a.threads));
    let layers = stage_layers(&a.model);
    let range = LayerRange::new(0, layers, layers).expect("range");
    let mut stage = load_local_stage(&a.model, range, &pool).expect("stage");
    let ctx = edit_prompt.len();
    let prefill = [ChunkSpec {
        seq_id: 1,
        len: ctx,
        want_logits: false,
        pool: Pool::None,
    }];
    stage
        .forward(&prefill, StageData::Tokens(edit_prompt.clone()), &[])
        .expect("prefill");
    let one = pass_secs(&mut stage, ctx, &edit_prompt[..1], 1);
    println!(
        "== pass cost at context {ctx}, {} threads (1-row step {:.3} ms)",
        a.threads,
        one * 1e3
    );
    println!(
        "| rows t | all t logits (verify) | last row's logits | no logits | x step (verify) |"
    );
    for t in 1..=10 {
        let fed = &edit_prompt[..t];
        let all = pass_secs(&mut stage, ctx, fed, t);
        let last = pass_secs(&mut stage, ctx, fed, 1);
        let none = pass_secs(&mut stage, ctx, fed, 0);
        println!(
            "| {t} | {:.3} ms | {:.3} ms | {:.3} ms | {:.2} |",
            all * 1e3,
            last * 1e3,
            none * 1e3,
            all / one
        );
    }
}

fn stage_layers(path: &std::path::Path) -> usize {
    let f = shoal_model::gguf::GgufFile::open(path).expect("gguf");
    shoal_model::ModelConfig::from_gguf(&f)
        .expect("config")
        .n_layers
}

fn summary(what: &str, passes: &[Pass], tokens: usize) {
    let drafted: usize = passes.iter().map(|p| p.draft.len()).sum();
    let accepted: usize = passes.iter().map(|p| p.accepted).sum();
    let empty = passes.iter().filter(|p| p.draft.is_empty()).count();
    let full = passes
        .iter()
        .filter(|p| !p.draft.is_empty() && p.accepted == p.draft.len())
        .count();
    println!(
        "  {what}: {} passes for {tokens} tokens ({:.2} tokens/pass), {empty} drafted nothing, \
         {full} accepted whole; drafted {drafted}, accepted {accepted} ({:.2})",
        passes.len(),
        tokens as f64 / passes.len() as f64,
        accepted as f64 / drafted.max(1) as f64,
    );
}

/// The lookup before the copy was followed: the latest earlier occurrence of the longest suffix (3
/// tokens down to 1), continued up to the sequence's end.
#[derive(Debug)]
struct Plain;

impl DraftSource for Plain {
    fn propose(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        let len = tokens.len();
        for n in (1..=3.min(len.saturating_sub(1))).rev() {
            let tail = &tokens[len - n..];
            if let Some(j) = (0..len - n).rev().find(|&j| &tokens[j..j + n] == tail) {
                return tokens[j + n..(j + n + max).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

/// Buckets of support: 0 for the first token after a substitution, then support 0–1, 2, 3, 4–5,
/// 6–8, 9–12, 13–15 and the whole window.
const SUPPORT_BUCKETS: usize = 9;

fn support_bucket(support: usize, resync: bool) -> usize {
    match (resync, support.min(WINDOW)) {
        (true, _) => 0,
        (_, 0..=1) => 1,
        (_, s @ 2..=3) => s,
        (_, 4..=5) => 4,
        (_, 6..=8) => 5,
        (_, 9..=12) => 6,
        (_, s) if s < WINDOW => 7,
        _ => 8,
    }
}

/// Acceptance of drafted tokens by support bucket, drafting 8 every pass.
fn buckets(d: &mut NgramDraft, prompt: &[u32], out: &[u32]) {
    let mut tokens = prompt.to_vec();
    let mut judged = [(0usize, 0usize); SUPPORT_BUCKETS];
    let mut j = 0;
    while j < out.len() {
        let p = d.propose_scored(&tokens, 8.min(out.len() - j - 1));
        let accepted = match &p {
            Some(Proposal {
                tokens: draft,
                support,
                resync,
            }) => {
                let acc = draft
                    .iter()
                    .zip(&out[j..])
                    .take_while(|(a, b)| a == b)
                    .count();
                for i in 0..draft.len().min(acc + 1) {
                    let b = if *resync && i == 0 {
                        0
                    } else {
                        support_bucket(support + i, false)
                    };
                    judged[b].1 += 1;
                    judged[b].0 += usize::from(i < acc);
                }
                acc
            }
            None => 0,
        };
        tokens.extend_from_slice(&out[j..j + accepted + 1]);
        j += accepted + 1;
    }
    println!("  acceptance by support bucket (accepted/judged): {judged:?}");
}
