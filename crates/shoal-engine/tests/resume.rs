//! Streams that survive a stage's death (`shoal_engine::resume`), on the real engine thread driving the
//! scripted stage of `common::scripted`: a request submitted through `Engines` whose stage is lost
//! midway continues on the model's next engine with exactly the tokens it would have had, one request's
//! usage; what cannot be resumed (a stop sequence, no engine coming back) still ends with the error.

use std::sync::Arc;
use std::time::Duration;

use shoal_engine::resume::RESUME_WAIT;
use shoal_engine::{EngineError, Engines, Event};

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
) -> (shoal_engine::RequestStream, Arc<Script>) {
    let script = Script::closed();
    let first = engine(&script, false, 64, 1);
    engines.insert(first.clone());
    let mut req = request(prompt, n);
    req.stop = stop;
    let mut stream = engines.submit_n(req, 1).expect("submit").pop().unwrap();
    // `before` launches (the prompt's, then one per token) go through; the next one fails.
    script.allow(Some(before));
    for _ in 0..before {
        match tokio::time::timeout(PATIENCE, stream.next())
            .await
            .unwrap()
            .unwrap()
        {
            Event::Token { .. } => {}
            other => panic!("expected a token, got {other:?}"),
        }
    }
    *lock(&script.fail) = Some(stream.id());
    script.allow(None);
    (stream, script)
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
async fn a_request_with_a_stop_sequence_or_no_engine_coming_back_ends_with_the_error() {
    let engines = Engines::default();
    let (mut stream, _script) = broken_after(&engines, &[1, 2], 6, 2, vec!["zz".into()]).await;
    let (tokens, last) = finish(&mut stream).await;
    assert!(tokens.is_empty());
    assert_eq!(
        last,
        Event::Error(EngineError::StageLost("scripted failure".into()))
    );

    // Resumable, but no other engine for the model appears: the error says so after the wait.
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
