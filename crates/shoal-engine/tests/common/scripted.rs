//! The scripted stage the worker tests drive the real engine thread with (see `tests/worker.rs`): the
//! pipeline's last stage "sampling" the token after the last one of each sequence (1 → 2 → … → 15 → 1),
//! a gate that holds the engine inside a launch, and the engine, requests and expected outputs around it.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};
use shoal_engine::engine::{EngineConfig, LoadedModel, spawn};
use shoal_engine::stage::{
    ChunkSpec, KvOp, Launched, Pick, SampleRef, Stage, StageData, StageInfo, sample_row,
};
use shoal_engine::{
    EngineError, EngineHandle, Event, FinishReason, GenerateRequest, Prompt, RequestStream,
};
use shoal_model::ModelConfig;
use shoal_model::tokenizer::Tokenizer;

use super::PATIENCE;

pub const MODEL: &str = "scripted";
/// Tokens 1..=15 are letters; 0 ends a generation.
pub const VOCAB: usize = 16;
/// KV bytes per token of the model below: K and V × 1 layer × 1 head × 1 value × 1 byte.
pub const KV_TOKEN: usize = 2;

/// What the scripted stage saw, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    /// A launched batch: each chunk's sequence and tokens.
    Launch(Vec<(u64, Vec<u32>)>),
    Kv(KvOp),
}

/// State shared by the test and its scripted stage.
#[derive(Default)]
pub struct Script {
    pub seen: Mutex<Vec<Seen>>,
    /// KV tokens held per sequence.
    pub held: Mutex<HashMap<u64, usize>>,
    /// The most KV tokens held at once.
    pub most: AtomicUsize,
    /// Launches that may still start (`None`: any number).
    pub permits: Mutex<Option<usize>>,
    /// Launches entered so far (counted before waiting for a permit).
    pub entered: Mutex<usize>,
    pub changed: Condvar,
    /// The first batch holding this sequence fails.
    pub fail: Mutex<Option<u64>>,
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Script {
    pub fn closed() -> Arc<Self> {
        let s = Script::default();
        *lock(&s.permits) = Some(0);
        Arc::new(s)
    }

    /// Lets `n` more launches start (`None`: every launch from now on).
    pub fn allow(&self, n: Option<usize>) {
        let mut p = lock(&self.permits);
        *p = match (*p, n) {
            (Some(have), Some(more)) => Some(have + more),
            _ => None,
        };
        self.changed.notify_all();
    }

    /// Waits until `n` launches have been entered (the engine is then inside launch `n`, or past it).
    pub fn wait_entered(&self, n: usize) {
        let start = Instant::now();
        let mut entered = lock(&self.entered);
        while *entered < n {
            assert!(
                start.elapsed() < PATIENCE,
                "the engine never launched {n} batches"
            );
            entered = self
                .changed
                .wait_timeout(entered, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The engine thread's side of the gate.
    pub fn pass_gate(&self) {
        *lock(&self.entered) += 1;
        self.changed.notify_all();
        let mut p = lock(&self.permits);
        loop {
            match *p {
                None => return,
                Some(n) if n > 0 => {
                    *p = Some(n - 1);
                    return;
                }
                Some(_) => p = self.changed.wait(p).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.seen).clone()
    }

    /// Index of the first entry that `pred` matches.
    pub fn first(&self, pred: impl Fn(&Seen) -> bool) -> Option<usize> {
        self.seen().iter().position(pred)
    }

    /// Whether the stage ever saw sequence `seq` (in a batch or a KV operation).
    pub fn touched(&self, seq: u64) -> bool {
        self.seen().iter().any(|s| match s {
            Seen::Launch(chunks) => chunks.iter().any(|c| c.0 == seq),
            Seen::Kv(
                KvOp::Release { seq_id }
                | KvOp::Retain { seq_id, .. }
                | KvOp::Rewind { seq_id, .. },
            ) => *seq_id == seq,
            Seen::Kv(KvOp::Start { seq_id, .. } | KvOp::Fork { into: seq_id, .. }) => {
                *seq_id == seq
            }
            Seen::Kv(KvOp::DropPrefix { .. }) => false,
        })
    }

    /// The tokens of every chunk of sequence `seq` launched, in order.
    pub fn launched(&self, seq: u64) -> Vec<Vec<u32>> {
        self.seen()
            .into_iter()
            .filter_map(|s| match s {
                Seen::Launch(chunks) => chunks.into_iter().find(|c| c.0 == seq).map(|c| c.1),
                Seen::Kv(_) => None,
            })
            .collect()
    }
}

/// The scripted last stage. With `in_flight`, it stands for stages on another node: a batch stays
/// pending until [`Stage::complete`], so two micro-batches can be in flight at once.
pub struct Scripted {
    pub script: Arc<Script>,
    pub in_flight: bool,
    pub pending: VecDeque<(u64, Result<Vec<Pick>, EngineError>)>,
    pub next_ticket: u64,
}

/// The token the script picks after `history`.
pub fn next_token(history: &[u32]) -> u32 {
    history.last().map_or(1, |&t| t % 15 + 1)
}

impl Stage for Scripted {
    fn info(&self) -> StageInfo {
        StageInfo {
            concurrent_stages: usize::from(self.in_flight),
            kv_value_bytes: 1,
            local_kv_layers: 1,
            kv_token_capacity: None,
        }
    }

    fn launch(
        &mut self,
        batch: &[ChunkSpec],
        input: StageData,
        sampling: &[SampleRef<'_>],
    ) -> Result<Launched, EngineError> {
        self.script.pass_gate();
        let StageData::Tokens(tokens) = input else {
            return Err(EngineError::Internal("the first stage takes tokens".into()));
        };
        let mut chunks = Vec::new();
        let mut at = 0;
        for c in batch {
            chunks.push((c.seq_id, tokens[at..at + c.len].to_vec()));
            at += c.len;
        }
        lock(&self.script.seen).push(Seen::Launch(chunks));
        let fail = lock(&self.script.fail).is_some_and(|f| batch.iter().any(|c| c.seq_id == f));
        let result = if fail {
            *lock(&self.script.fail) = None;
            Err(EngineError::StageLost("scripted failure".into()))
        } else {
            let mut held = lock(&self.script.held);
            for c in batch {
                *held.entry(c.seq_id).or_default() += c.len;
            }
            self.script
                .most
                .fetch_max(held.values().sum(), Ordering::SeqCst);
            // Logits that favour the scripted token, sampled by the engine's own path (a request's
            // logits processor applies there).
            Ok(sampling
                .iter()
                .map(|s| {
                    let mut row = vec![0.0f32; VOCAB];
                    let next = next_token(s.history);
                    row[next as usize] = 10.0;
                    // The runner-up: the token the script would pick after `next`.
                    row[next_token(&[next]) as usize] = 5.0;
                    sample_row(s, &mut row)
                })
                .collect())
        };
        if !self.in_flight {
            return result
                .map(|picks: Vec<Pick>| Launched::Ready(StageData::Sampled(picks.into())));
        }
        self.next_ticket += 1;
        self.pending.push_back((self.next_ticket, result));
        Ok(Launched::Pending(self.next_ticket))
    }

    fn complete(&mut self, ticket: u64) -> Result<StageData, EngineError> {
        match self.pending.pop_front() {
            Some((t, result)) if t == ticket => {
                result.map(|picks| StageData::Sampled(picks.into()))
            }
            _ => Err(EngineError::Internal(format!(
                "no batch {ticket} in flight"
            ))),
        }
    }

    fn kv(&mut self, op: KvOp) -> Result<(), EngineError> {
        lock(&self.script.seen).push(Seen::Kv(op));
        let mut held = lock(&self.script.held);
        match op {
            KvOp::Release { seq_id } | KvOp::Retain { seq_id, .. } => {
                held.remove(&seq_id);
            }
            KvOp::Start { seq_id, len, .. }
            | KvOp::Fork {
                into: seq_id, len, ..
            } => {
                held.insert(seq_id, len);
            }
            KvOp::Rewind { seq_id, len } => {
                if let Some(h) = held.get_mut(&seq_id) {
                    *h = (*h).min(len);
                }
            }
            KvOp::DropPrefix { .. } => {}
        }
        Ok(())
    }

    fn held_sequences(&self) -> usize {
        lock(&self.script.held).len()
    }

    /// The script picks one token a chunk: it returns no row per drafted token.
    fn verifies(&self) -> bool {
        false
    }
}

/// Sixteen tokens: `<eos>` (0, control) and the letters a..o (1..=15).
pub fn tokenizer() -> Tokenizer {
    let mut tokens = vec![Value::String("<eos>".into())];
    tokens.extend((b'a'..=b'o').map(|c| Value::String((c as char).to_string())));
    let types = (0..VOCAB)
        .map(|i| Value::I32(if i == 0 { 3 } else { 1 }))
        .collect();
    let metadata = HashMap::from([
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".to_string(),
            Value::String("gpt2".into()),
        ),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".to_string(), Value::Array(types)),
        ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(0)),
    ]);
    let content = Content {
        magic: VersionedMagic::GgufV3,
        metadata,
        tensor_infos: HashMap::new(),
        tensor_data_offset: 0,
    };
    Tokenizer::from_gguf(&content).expect("tokenizer")
}

/// An engine on a scripted stage with room for `kv_tokens` tokens of KV.
pub fn engine(
    script: &Arc<Script>,
    in_flight: bool,
    kv_tokens: usize,
    max_running: usize,
) -> EngineHandle {
    let config = EngineConfig {
        threads: 1,
        max_running,
        prefix_cache_tokens: 0,
        kv_budget_bytes: kv_tokens * KV_TOKEN,
        ..Default::default()
    };
    engine_with(script, in_flight, config)
}

/// An engine on a scripted stage with `config`.
pub fn engine_with(
    script: &Arc<Script>,
    in_flight: bool,
    engine_config: EngineConfig,
) -> EngineHandle {
    let config = ModelConfig {
        architecture: "llama".into(),
        n_layers: 1,
        dim: 1,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 1,
        ffn_dim: 1,
        vocab_size: VOCAB,
        context_length: 64,
        rope_theta: 10_000.0,
        rms_eps: 1e-5,
        arch: shoal_model::ArchParams::llama(1, 1),
    };
    assert_eq!(config.kv_bytes_per_token(1, 1), KV_TOKEN);
    let stage = Scripted {
        script: script.clone(),
        in_flight,
        pending: VecDeque::new(),
        next_ticket: 0,
    };
    let model = LoadedModel {
        id: MODEL.into(),
        config,
        tokenizer: Arc::new(tokenizer()),
        template: None,
        stages: vec![Box::new(stage)],
        kv_source: Default::default(),
        token_list: None,
    };
    spawn(model, engine_config).expect("engine")
}

pub fn request(prompt: &[u32], max_tokens: u32) -> GenerateRequest {
    super::greedy(MODEL, Prompt::Tokens(prompt.to_vec()), max_tokens)
}

/// What the script generates after `prompt`, `n` tokens.
pub fn expected(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        seq.push(next_token(&seq));
    }
    seq.split_off(prompt.len())
}

/// Reads `stream` to its end: the tokens and the last event.
pub async fn finish(stream: &mut RequestStream) -> (Vec<u32>, Event) {
    let (tokens, _, last) = finish_all(stream).await;
    (tokens, last)
}

/// Reads `stream` to its end: the tokens, their text and the last event.
pub async fn finish_all(stream: &mut RequestStream) -> (Vec<u32>, String, Event) {
    let (mut tokens, mut text) = (Vec::new(), String::new());
    loop {
        let event = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("engine stalled")
            .expect("stream ended without a final event");
        match event {
            Event::Token { id, text: t, .. } => {
                tokens.push(id);
                text.push_str(&t);
            }
            last => return (tokens, text, last),
        }
    }
}

/// Asserts that `last` ends a cancelled request.
pub fn assert_cancelled(last: &Event) {
    assert!(
        matches!(
            last,
            Event::Done {
                finish_reason: FinishReason::Cancelled,
                ..
            }
        ),
        "{last:?}"
    );
}

pub fn length(n: u32, prompt: u32) -> Event {
    Event::Done {
        finish_reason: FinishReason::Length,
        usage: shoal_engine::Usage {
            prompt_tokens: prompt,
            completion_tokens: n,
            cached_tokens: 0,
        },
        stop_sequence: None,
    }
}
