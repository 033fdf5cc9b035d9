//! The real engine thread, started through `engine::spawn`, driving a scripted stage instead of a model:
//! admission within the KV budget, preemption and resumption, cancellation (queued and running) and
//! stage errors. No GGUF: the model config and a sixteen-token vocabulary are built here.
//!
//! The scripted stage is the pipeline's last stage: it "samples" the token after the last one of each
//! sequence (1 → 2 → … → 15 → 1, never the end-of-generation token 0), so every output is known in
//! advance and does not depend on batching. A gate lets a test hold the engine inside a launch while
//! it submits or cancels, so each scenario runs the same way every time.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use shoal_engine::engine::EngineConfig;
use shoal_engine::stage::KvOp;
use shoal_engine::{
    ConstraintError, EngineError, Event, FinishReason, Prefill, RequestStream, TokenMask,
};

mod common;
use common::scripted::*;
use common::{PATIENCE, wait_for};

#[tokio::test]
async fn a_request_that_does_not_fit_waits_until_another_finishes() {
    // Room for 8 tokens: A (4 prompt + 4 generated) holds 4 to 7 of them, B needs 5 to start.
    let script = Script::closed();
    let engine = engine(&script, false, 8, 64);
    let (pa, pb) = ([1, 2, 3, 4], [5, 6, 7, 8]);
    let mut a = engine.submit(request(&pa, 4)).expect("submit");
    script.wait_entered(1);
    let mut b = engine.submit(request(&pb, 4)).expect("submit");
    assert_eq!(engine.stats().waiting, 1);
    script.allow(None);
    assert_eq!(finish(&mut a).await, (expected(&pa, 4), length(4, 4)));
    assert_eq!(finish(&mut b).await, (expected(&pb, 4), length(4, 4)));
    let a_freed = script
        .first(|s| *s == Seen::Kv(KvOp::Release { seq_id: a.id() }))
        .expect("A's KV released");
    let b_starts = script
        .first(|s| matches!(s, Seen::Launch(c) if c.iter().any(|c| c.0 == b.id())))
        .expect("B launched");
    assert!(
        b_starts > a_freed,
        "B ran before A gave its KV back: {:?}",
        script.seen()
    );
    assert_eq!(script.launched(b.id())[0], pb, "B prefilled once, in full");
    assert!(script.most.load(Ordering::SeqCst) <= 8);
    wait_for(&engine, "everything to be freed", |s| {
        s.active_sequences == 0 && s.waiting == 0 && s.kv_tokens == 0
    });
}

#[tokio::test]
async fn decodes_that_no_longer_fit_preempt_the_newest_which_resumes_with_the_same_tokens() {
    // Room for 8 tokens: A (3 + 4) and B (3 + 3) both start, but cannot both decode for long.
    let script = Script::closed();
    let engine = engine(&script, false, 8, 64);
    let (pa, pb) = ([1, 2, 3], [9, 10, 11]);
    let mut a = engine.submit(request(&pa, 4)).expect("submit");
    script.wait_entered(1);
    let mut b = engine.submit(request(&pb, 3)).expect("submit");
    script.allow(None);
    // Every token exactly once, as if each ran alone.
    assert_eq!(finish(&mut a).await, (expected(&pa, 4), length(4, 3)));
    assert_eq!(finish(&mut b).await, (expected(&pb, 3), length(3, 3)));
    let preempted = script
        .first(|s| *s == Seen::Kv(KvOp::Release { seq_id: b.id() }))
        .expect("B preempted");
    let a_done = script
        .first(|s| *s == Seen::Kv(KvOp::Release { seq_id: a.id() }))
        .expect("A released");
    assert!(
        preempted < a_done,
        "B was preempted while A ran: {:?}",
        script.seen()
    );
    // B started with its prompt, then after A finished recomputed its prompt and its first token.
    let b_chunks = script.launched(b.id());
    assert_eq!(b_chunks[0], pb);
    let mut resumed = pb.to_vec();
    resumed.push(expected(&pb, 1)[0]);
    assert_eq!(b_chunks[1], resumed, "{b_chunks:?}");
    assert!(script.most.load(Ordering::SeqCst) <= 8);
}

#[tokio::test]
async fn cancelling_a_queued_and_a_running_request_frees_their_kv() {
    let script = Script::closed();
    let engine = engine(&script, false, 64, 1);
    let prompt = [1, 2, 3];
    let mut running = engine.submit(request(&prompt, 40)).expect("submit");
    script.wait_entered(1);
    script.allow(Some(2));
    // Prefill and one decode step ran; the engine waits inside its third launch.
    for want in expected(&prompt, 2) {
        match finish_one(&mut running).await {
            Event::Token { id, .. } => assert_eq!(id, want),
            other => panic!("expected a token, got {other:?}"),
        }
    }
    script.wait_entered(3);
    // Only one sequence may run: the second request waits in the queue.
    let mut queued = engine.submit(request(&[4, 5], 4)).expect("submit");
    assert!(engine.cancel(queued.id()));
    assert!(engine.cancel(running.id()));
    script.allow(None);
    let (tokens, last) = finish(&mut queued).await;
    assert!(tokens.is_empty());
    assert_eq!(
        last,
        Event::Done {
            finish_reason: FinishReason::Cancelled,
            usage: shoal_engine::Usage {
                prompt_tokens: 2,
                ..Default::default()
            },
            stop_sequence: None,
        }
    );
    let (_, last) = finish(&mut running).await;
    assert_cancelled(&last);
    wait_for(&engine, "both to be freed", |s| {
        s.active_sequences == 0 && s.waiting == 0 && s.kv_tokens == 0 && s.stage_sequences == 0
    });
    assert!(script.seen().contains(&Seen::Kv(KvOp::Release {
        seq_id: running.id()
    })));
    assert!(lock(&script.held).is_empty());
    // The queued request never reached the stage.
    assert!(script.launched(queued.id()).is_empty());
    assert!(!script.touched(queued.id()));
}

/// The next event of `stream` (bounded wait).
async fn finish_one(stream: &mut RequestStream) -> Event {
    tokio::time::timeout(PATIENCE, stream.next())
        .await
        .expect("engine stalled")
        .expect("stream ended")
}

#[tokio::test]
async fn a_stage_error_fails_its_batch_and_the_next_request_is_served() {
    // One sequence at a time: the failing batch holds A only; B waits, then runs normally.
    let script = Script::closed();
    let engine = engine(&script, false, 64, 1);
    let mut a = engine.submit(request(&[1, 2, 3], 5)).expect("submit");
    script.wait_entered(1);
    let mut b = engine.submit(request(&[6, 7], 3)).expect("submit");
    *lock(&script.fail) = Some(a.id());
    script.allow(None);
    let (tokens, last) = finish(&mut a).await;
    assert!(tokens.is_empty());
    assert_eq!(
        last,
        Event::Error(EngineError::StageLost("scripted failure".into()))
    );
    assert_eq!(finish(&mut b).await, (expected(&[6, 7], 3), length(3, 2)));
    assert!(
        script
            .seen()
            .contains(&Seen::Kv(KvOp::Release { seq_id: a.id() }))
    );
    wait_for(&engine, "everything to be freed", |s| {
        s.active_sequences == 0 && s.kv_tokens == 0 && s.stage_sequences == 0
    });
}

#[tokio::test]
async fn a_lost_batch_in_flight_fails_only_its_own_sequences() {
    // Stages on "another node": A and B go in separate micro-batches, both in flight; B's is lost.
    let script = Script::closed();
    let engine = engine(&script, true, 64, 64);
    let pa = [1, 2, 3];
    let mut a = engine.submit(request(&pa, 6)).expect("submit");
    script.wait_entered(1);
    let mut b = engine.submit(request(&[8, 9], 6)).expect("submit");
    *lock(&script.fail) = Some(b.id());
    script.allow(None);
    let (tokens, last) = finish(&mut b).await;
    assert!(tokens.is_empty());
    assert_eq!(
        last,
        Event::Error(EngineError::StageLost("scripted failure".into()))
    );
    assert_eq!(finish(&mut a).await, (expected(&pa, 6), length(6, 3)));
    assert!(
        script
            .first(|s| matches!(s, Seen::Launch(c) if c.len() > 1))
            .is_none(),
        "A and B shared a micro-batch: {:?}",
        script.seen()
    );
    let mut c = engine.submit(request(&[4], 2)).expect("submit");
    assert_eq!(finish(&mut c).await, (expected(&[4], 2), length(2, 1)));
    wait_for(&engine, "everything to be freed", |s| {
        s.active_sequences == 0 && s.kv_tokens == 0 && s.stage_sequences == 0
    });
}

#[tokio::test]
async fn the_front_door_checks_each_thing_once_and_routes_by_model() {
    let script = Script::closed();
    script.allow(None);
    let engine = engine(&script, false, 64, 64);
    let engines = shoal_engine::Engines::from(engine.clone());
    let mut other = request(&[1], 2);
    other.model = "nope".into();
    assert!(matches!(
        engines.submit(other.clone()),
        Err(EngineError::ModelNotFound { model }) if model == "nope"
    ));
    assert!(matches!(
        engine.submit(other),
        Err(EngineError::ModelNotFound { .. })
    ));
    assert!(matches!(
        engines.submit(request(&[1, VOCAB as u32], 2)),
        Err(EngineError::InvalidParam {
            param: "prompt",
            ..
        })
    ));
    assert!(matches!(
        engines.submit(request(&[1; 64], 2)),
        Err(EngineError::PromptTooLong {
            prompt_tokens: 64,
            context_length: 64
        })
    ));
    assert!(matches!(
        engines.submit(request(&[], 2)),
        Err(EngineError::EmptyPrompt)
    ));
    assert_eq!(
        shoal_engine::request::max_tokens(0),
        Err(EngineError::InvalidParam {
            param: "max_tokens",
            message: "max_tokens must be at least 1".into()
        })
    );
    assert!(matches!(
        engines.render_chat(MODEL, &[shoal_engine::ChatMessage::new("user", "hi")]),
        Err(EngineError::NoChatTemplate { model }) if model == MODEL
    ));
    let mut s = engines.submit(request(&[2, 3], 2)).expect("submit");
    assert_eq!(finish(&mut s).await, (expected(&[2, 3], 2), length(2, 2)));
    assert_eq!(engines.models().len(), 1);
    assert_eq!(engines.stats(), engine.stats());
}

/// Bans one token and records every token its sequence accepts.
#[derive(Debug, Clone)]
struct Ban {
    token: u32,
    accepted: Arc<Mutex<Vec<u32>>>,
}

impl shoal_engine::LogitsProcessor for Ban {
    fn allowed(&mut self, _history: &[u32]) -> Result<Option<TokenMask>, ConstraintError> {
        Ok(Some(TokenMask::banning(VOCAB, [self.token])))
    }
    fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        lock(&self.accepted).push(token);
        Ok(())
    }
    fn clone_box(&self) -> Box<dyn shoal_engine::LogitsProcessor> {
        Box::new(self.clone())
    }
}

/// Runs the Ban scenario on an engine whose stage samples here (`in_flight: false`) or, like a
/// pipeline whose last stage is on another node, later (`true`): the same tokens either way.
async fn ban_scenario(in_flight: bool) {
    let script = Script::closed();
    script.allow(None);
    let engine = engine(&script, in_flight, 64, 64);
    // Unconstrained, the script continues [3] with 4, 5, 6.
    let mut plain = engine.submit(request(&[3], 3)).expect("submit");
    assert_eq!(finish(&mut plain).await.0, expected(&[3], 3));
    // Banning 5: the pick after 4 is another token, and the processor hears each token taken.
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let mut constrained = request(&[3], 3);
    constrained.logits_processor = Some(Box::new(Ban {
        token: 5,
        accepted: accepted.clone(),
    }));
    let mut s = engine.submit(constrained).expect("submit");
    let (tokens, last) = finish(&mut s).await;
    // After 4 the banned 5 gives way to its runner-up 6, then the script goes on from 6.
    assert_eq!(tokens, vec![4, 6, 7]);
    assert_eq!(last, length(3, 1));
    assert_eq!(*lock(&accepted), tokens);
}

#[tokio::test]
async fn a_logits_processor_shapes_every_pick_and_hears_every_token() {
    ban_scenario(false).await;
}

/// Formerly refused: the mask now travels with the step to a stage that samples elsewhere.
#[tokio::test]
async fn a_pipeline_that_samples_on_another_node_applies_the_mask() {
    ban_scenario(true).await;
}

/// Allows nothing after the first token it hears.
#[derive(Debug, Clone, Default)]
struct DeadEnd {
    heard: usize,
}

impl shoal_engine::LogitsProcessor for DeadEnd {
    fn allowed(&mut self, _history: &[u32]) -> Result<Option<TokenMask>, ConstraintError> {
        match self.heard {
            0 => Ok(None),
            _ => Ok(Some(TokenMask::allowing(VOCAB, []))),
        }
    }
    fn accept(&mut self, _token: u32) -> Result<(), ConstraintError> {
        self.heard += 1;
        Ok(())
    }
    fn clone_box(&self) -> Box<dyn shoal_engine::LogitsProcessor> {
        Box::new(self.clone())
    }
}

#[tokio::test]
async fn a_constraint_that_allows_nothing_ends_its_sequence_with_an_error_and_frees_it() {
    let script = Script::closed();
    script.allow(None);
    let engine = engine(&script, false, 64, 64);
    let mut req = request(&[3], 5);
    req.logits_processor = Some(Box::new(DeadEnd::default()));
    let mut s = engine.submit(req).expect("submit");
    let (tokens, last) = finish(&mut s).await;
    assert_eq!(tokens, vec![4], "one free token, then no token is allowed");
    assert!(
        matches!(&last, Event::Error(EngineError::Internal(m)) if m.contains("allows no next token")),
        "{last:?}"
    );
    wait_for(&engine, "the sequence freed", |st| st.active_sequences == 0);
    assert!(lock(&script.held).is_empty(), "its KV was released");
    // The engine goes on serving.
    let mut s = engine.submit(request(&[2, 3], 2)).expect("submit");
    assert_eq!(finish(&mut s).await, (expected(&[2, 3], 2), length(2, 2)));
}

async fn prefill_progress_scenario(in_flight: bool) {
    // A 40-token prompt in chunks of 8: the progress moves by one chunk per landed batch (on the last
    // stage of a pipeline too), ends at the whole prompt, and decoding never touches it.
    let script = Script::closed();
    let config = EngineConfig {
        threads: 1,
        prefix_cache_tokens: 0,
        max_batch_tokens: 8,
        kv_budget_bytes: 64 * KV_TOKEN,
        ..Default::default()
    };
    let engine = engine_with(&script, in_flight, config);
    let prompt: Vec<u32> = (0..40).map(|i| i % 15 + 1).collect();
    let mut stream = engine.submit(request(&prompt, 3)).expect("submit");
    let mut progress = stream.prefill();
    assert_eq!(
        *progress.borrow_and_update(),
        Prefill { done: 0, total: 40 }
    );
    for chunk in 1..=5 {
        script.allow(Some(1));
        tokio::time::timeout(PATIENCE, progress.changed())
            .await
            .expect("no progress")
            .expect("progress dropped");
        let seen = *progress.borrow_and_update();
        assert_eq!(
            seen,
            Prefill {
                done: 8 * chunk,
                total: 40
            }
        );
    }
    script.allow(None);
    assert_eq!(
        finish(&mut stream).await,
        (expected(&prompt, 3), length(3, 40))
    );
    assert!(
        !progress.has_changed().unwrap_or(false),
        "decode steps report nothing"
    );
}

#[tokio::test]
async fn a_long_prompt_reports_its_prefill_progress_chunk_by_chunk() {
    prefill_progress_scenario(false).await;
}

#[tokio::test]
async fn a_pipeline_reports_prefill_progress_as_its_batches_land() {
    prefill_progress_scenario(true).await;
}
