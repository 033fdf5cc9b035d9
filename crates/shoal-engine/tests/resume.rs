//! Streams that survive a stage's death (`shoal_engine::resume`), on the real engine thread driving the
//! scripted stage of `common::scripted`: a request submitted through `Engines` whose stage is lost
//! midway continues on the model's next engine with exactly the tokens and text it would have had, one
//! request's usage — with a stop sequence, a constraint, several choices, a seed, a second break; a
//! continuation is cancelled by its first id; with no engine coming back the stream ends with the error.

use std::sync::Arc;
use std::time::Duration;

use shoal_engine::resume::RESUME_WAIT;
use shoal_engine::{
    ConstraintError, EngineError, Engines, Event, FinishReason, GenerateRequest, LogitsProcessor,
    RequestStream, TokenMask,
};

mod common;
use common::PATIENCE;
use common::scripted::*;

/// Submits `prompt` for `n` tokens through `engines` on a gated first engine, lets it generate `before`
/// tokens, then loses its stage. Returns the stream and the first engine's script.
async fn broken_after(
    engines: &Engines,
    prompt: &[u32],
    n: u32,
    before: usize,
    stop: Vec<String>,
) -> (RequestStream, Arc<Script>) {
    let mut req = request(prompt, n);
    req.stop = stop;
    let (mut streams, script, _) = break_choices(engines, req, 1, before).await;
    (streams.pop().unwrap(), script)
}

/// Submits `n` choices of `req` through `engines` on a gated first engine, lets `before` launches
/// through, then loses its stage in the next. Returns the streams, the first engine's script and, for one
/// choice, the text it gave before the break (read here; several choices' tokens are left unread).
async fn break_choices(
    engines: &Engines,
    req: GenerateRequest,
    n: usize,
    before: usize,
) -> (Vec<RequestStream>, Arc<Script>, String) {
    let script = Script::closed();
    let first = engine(&script, false, 64, n);
    engines.insert(first.clone());
    let mut streams = engines.submit_n(req, n).expect("submit");
    script.allow(Some(before));
    // The engine waits inside the next launch: every token of the ones before is sent.
    script.wait_entered(before + 1);
    let mut text = String::new();
    if n == 1 {
        for _ in 0..before {
            match tokio::time::timeout(PATIENCE, streams[0].next())
                .await
                .unwrap()
                .unwrap()
            {
                Event::Token { text: t, .. } => text.push_str(&t),
                other => panic!("expected a token, got {other:?}"),
            }
        }
    }
    *lock(&script.fail) = Some(streams[0].id());
    script.allow(None);
    (streams, script, text)
}

/// Reads `stream` to its end: the text of its tokens and the last event.
async fn finish_text(stream: &mut RequestStream) -> (String, Event) {
    let (_, text, last) = finish_all(stream).await;
    (text, last)
}

/// A lone run of `req` on a fresh engine: its text and last event.
async fn lone_run(req: GenerateRequest) -> (String, Event) {
    let script = Arc::new(Script::default());
    let e = engine(&script, false, 64, 1);
    finish_text(&mut e.submit(req).expect("submit")).await
}

/// Breaks one choice of `req` after `before` launches and lets it continue on a new engine; then runs
/// it alone. Returns the text before the break, then the continued stream's and the lone run's whole
/// text and last event.
async fn continued_and_lone(
    req: GenerateRequest,
    before: usize,
) -> (String, (String, Event), (String, Event)) {
    let engines = Engines::default();
    let (mut streams, _script, first) = break_choices(&engines, req.clone(), 1, before).await;
    replace_later(
        &engines,
        Arc::new(Script::default()),
        Duration::from_millis(200),
    );
    let (after, last) = finish_text(&mut streams[0]).await;
    let whole = (format!("{first}{after}"), last);
    (first, whole, lone_run(req).await)
}

/// Puts a new engine for the model in `engines` after `after` (the instance placed again).
fn replace_later(engines: &Engines, script: Arc<Script>, after: Duration) {
    let engines = engines.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        engines.insert(engine(&script, false, 64, 2));
    });
}

#[tokio::test]
async fn a_stream_whose_stage_dies_continues_on_the_models_next_engine_with_its_own_tokens() {
    let engines = Engines::default();
    let prompt = [1, 2, 3];
    let (mut stream, _script) = broken_after(&engines, &prompt, 8, 3, vec![]).await;
    // The instance placed again: a new engine for the model takes its place a little later.
    let replacement = Arc::new(Script::default());
    let engines2 = engines.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        engines2.insert(engine(&replacement, false, 64, 1));
    });
    let (rest, last) = finish(&mut stream).await;
    // The three tokens before the break were read above; the five after it are the same ones a lone
    // run gives, and the usage is one request's.
    assert_eq!(rest, expected(&prompt, 8)[3..]);
    assert_eq!(last, length(8, 3));
}

#[tokio::test]
async fn held_back_text_and_a_stop_sequence_across_the_break_are_the_lone_runs() {
    // Letters follow each other: after "abc" come "def…". Broken after "def", with "f" held back for a
    // possible "fgx" (never completed) and, in the second request, for "fg" (completed by the first
    // token after the break).
    for stop in ["fgx", "fg"] {
        let mut req = request(&[1, 2, 3], 8);
        req.stop = vec![stop.into()];
        let (before, whole, lone) = continued_and_lone(req, 3).await;
        assert_eq!(before, "de", "'f' is held back for {stop:?}");
        assert_eq!(whole, lone, "stop {stop:?}");
    }
}

/// Allows any letter for `left` tokens, then only the end of generation: a constraint whose state is
/// what it has accepted (a fresh copy would allow `left` more after the break).
#[derive(Debug, Clone)]
struct Budget {
    left: usize,
}

impl LogitsProcessor for Budget {
    fn allowed(&mut self, _history: &[u32]) -> Result<Option<TokenMask>, ConstraintError> {
        Ok((self.left == 0).then(|| TokenMask::allowing(VOCAB, [0])))
    }
    fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        if token == 0 {
            return Ok(());
        }
        self.left = self
            .left
            .checked_sub(1)
            .ok_or_else(|| ConstraintError::new("past the budget"))?;
        Ok(())
    }
    fn clone_box(&self) -> Box<dyn LogitsProcessor> {
        Box::new(self.clone())
    }
}

#[tokio::test]
async fn a_constrained_request_continues_with_its_constraint_past_the_tokens_it_had() {
    let mut req = request(&[1, 2, 3], 12);
    req.logits_processor = Some(Box::new(Budget { left: 5 }));
    let (_, whole, lone) = continued_and_lone(req, 3).await;
    assert_eq!(lone.0, "defgh");
    assert_eq!(whole, lone);
    let Event::Done { finish_reason, .. } = whole.1 else {
        panic!("{:?}", whole.1)
    };
    assert_eq!(finish_reason, FinishReason::Stop, "the constraint ended it");
}

#[tokio::test]
async fn every_choice_of_a_request_continues_and_a_seeded_sample_draws_as_its_lone_run() {
    let engines = Engines::default();
    let mut req = request(&[1, 2], 10);
    // Hot enough that the draws differ from the script's favourite now and then.
    req.sampling.temperature = 6.0;
    req.sampling.seed = Some(7);
    // The end of generation is as likely as any other letter this hot: draw all ten.
    req.ignore_eos = true;
    let (mut streams, first, _) = break_choices(&engines, req.clone(), 2, 4).await;
    replace_later(
        &engines,
        Arc::new(Script::default()),
        Duration::from_millis(200),
    );
    let mut whole = Vec::new();
    for stream in &mut streams {
        let (text, last) = finish_text(stream).await;
        assert!(
            matches!(
                last,
                Event::Done {
                    finish_reason: FinishReason::Length,
                    ..
                }
            ),
            "{last:?}"
        );
        whole.push(text);
    }
    // The failed launch held both choices: both broke and continued.
    let failed = first.seen().into_iter().rev().find_map(|s| match s {
        Seen::Launch(chunks) => Some(chunks.len()),
        Seen::Kv(_) => None,
    });
    assert_eq!(failed, Some(2));
    // Each choice as a lone run with its own seed (the first the request's, the second derived).
    let script = Arc::new(Script::default());
    let e = engine(&script, false, 64, 2);
    let mut lone = Vec::new();
    for mut s in e.submit_n(req, 2).expect("submit") {
        lone.push(finish_text(&mut s).await.0);
    }
    assert_eq!(whole, lone);
    assert_ne!(lone[0], lone[1], "two choices, two draws");
}

#[tokio::test]
async fn a_continuation_whose_stage_dies_too_continues_again() {
    let engines = Engines::default();
    let prompt = [1, 2, 3];
    let (mut stream, _script) = broken_after(&engines, &prompt, 10, 2, vec![]).await;
    // The second engine fails the continuation after its prefill's token and one more.
    let second = Script::closed();
    engines.insert(engine(&second, false, 64, 1));
    second.allow(Some(2));
    let mut tokens = Vec::new();
    for _ in 0..2 {
        match tokio::time::timeout(PATIENCE, stream.next())
            .await
            .unwrap()
            .unwrap()
        {
            Event::Token { id, .. } => tokens.push(id),
            other => panic!("expected a token, got {other:?}"),
        }
    }
    let continuation = second.seen().iter().find_map(|s| match s {
        Seen::Launch(chunks) => chunks.first().map(|c| c.0),
        Seen::Kv(_) => None,
    });
    *lock(&second.fail) = continuation;
    second.allow(None);
    replace_later(
        &engines,
        Arc::new(Script::default()),
        Duration::from_millis(200),
    );
    let (rest, last) = finish(&mut stream).await;
    tokens.extend(rest);
    assert_eq!(tokens, expected(&prompt, 10)[2..]);
    assert_eq!(last, length(10, 3));
}

#[tokio::test]
async fn a_continuation_is_cancelled_by_the_requests_first_id() {
    let engines = Engines::default();
    let (mut stream, _script) = broken_after(&engines, &[1, 2], 20, 2, vec![]).await;
    let second = Script::closed();
    engines.insert(engine(&second, false, 64, 1));
    second.allow(Some(1));
    assert!(matches!(
        tokio::time::timeout(PATIENCE, stream.next())
            .await
            .unwrap()
            .unwrap(),
        Event::Token { .. }
    ));
    // The first engine is gone from the registry; the id still names the request.
    assert!(engines.cancel(stream.id()));
    second.allow(None);
    let (_, last) = finish(&mut stream).await;
    assert_cancelled(&last);
}

#[tokio::test]
async fn with_no_engine_coming_back_the_stream_ends_with_the_error() {
    let engines = Engines::default();
    let started = std::time::Instant::now();
    let (mut stream, _script) = broken_after(&engines, &[4, 5], 6, 2, vec![]).await;
    let (tokens, last) = finish(&mut stream).await;
    assert!(tokens.is_empty());
    let Event::Error(EngineError::StageLost(why)) = last else {
        panic!("expected the stage's loss, got {last:?}");
    };
    assert!(
        why.contains("no instance of the model driven by this node was ready again"),
        "{why}"
    );
    assert!(started.elapsed() >= RESUME_WAIT);
}
