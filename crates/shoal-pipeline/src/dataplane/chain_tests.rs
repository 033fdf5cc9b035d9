//! Unit tests of the chain's watches and waits.

use super::*;
use crate::dataplane::Inbound;

/// The membership as a list of node ids, and what the chain's watch looks for in it.
fn gone_from(nodes: &'static [&'static str]) -> impl Fn(&Vec<String>) -> Option<NodeId> {
    move |members: &Vec<String>| {
        nodes
            .iter()
            .find(|n| !members.iter().any(|m| m == *n))
            .map(|n| n.parse().unwrap())
    }
}

#[tokio::test]
async fn a_node_leaving_is_an_event_on_the_chains_channel() {
    let (set, members) = watch::channel(vec!["a".to_string(), "b".into(), "c".into()]);
    let (tx, mut events) = mpsc::channel(READ_QUEUE);
    let (_stop, stop) = oneshot::channel();
    let task = watch_nodes(
        members,
        gone_from(&["b", "c"]),
        Alarm::Relay(tx.downgrade()),
        stop,
    );
    // Another node coming and going is no event (each change is seen: the test runs the watch
    // between them).
    for members in [vec!["b", "c"], vec!["b", "c", "d"]] {
        set.send_replace(members.into_iter().map(String::from).collect());
        tokio::task::yield_now().await;
        assert!(events.try_recv().is_err(), "no node of the chain left");
    }
    set.send_replace(vec!["a".into(), "b".into()]);
    match events.recv().await {
        Some(Err(PipelineError::NodeLeft { node })) => assert_eq!(node, "c"),
        other => panic!("expected node c to leave, got {other:?}"),
    }
    task.await.unwrap();
    drop(tx);
    assert!(
        events.recv().await.is_none(),
        "one event, then the watch ends"
    );
}

#[tokio::test]
async fn the_watch_ends_with_its_chain_and_never_keeps_the_channel_open() {
    let (_set, members) = watch::channel(vec!["b".to_string()]);
    let (tx, mut events) = mpsc::channel(READ_QUEUE);
    let (stop_tx, stop) = oneshot::channel::<()>();
    let task = watch_nodes(
        members,
        gone_from(&["b"]),
        Alarm::Relay(tx.downgrade()),
        stop,
    );
    // The reader ending (its sender dropped) closes the channel although the watch still runs.
    drop(tx);
    assert!(events.recv().await.is_none());
    drop(stop_tx);
    task.await.unwrap();
}

/// Regression: the engine thread is no runtime thread, and making the wait's timer outside the
/// runtime's context panicked (the first pipeline request of a real server failed).
#[test]
fn the_engine_thread_waits_for_tokens_from_outside_the_runtime() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let handle = rt.handle().clone();
    let (tx, rx) = mpsc::channel::<Inbound>(1);
    let mut rx = Inlet::Relay(rx);
    let engine_thread = std::thread::spawn(move || {
        let soon = || tokio::time::Instant::now() + std::time::Duration::from_millis(20);
        let timed_out = rx.recv_by(&handle, soon()).is_err();
        handle.spawn(async move {
            let _ = tx.send(Ok(Frame::Ping { nonce: 7 })).await;
        });
        let got = match rx.recv_by(&handle, soon() + BATCH_TIMEOUT) {
            Ok(Some(Ok(Frame::Ping { nonce }))) => Some(nonce),
            _ => None,
        };
        let closed = matches!(rx.recv_by(&handle, soon() + BATCH_TIMEOUT), Ok(None));
        (timed_out, got, closed)
    });
    assert_eq!(engine_thread.join().unwrap(), (true, Some(7), true));
}

#[tokio::test]
async fn a_node_already_gone_is_reported_at_once() {
    let (_set, members) = watch::channel(vec!["a".to_string()]);
    let (tx, mut events) = mpsc::channel(READ_QUEUE);
    let (_stop, stop) = oneshot::channel();
    watch_nodes(
        members,
        gone_from(&["b"]),
        Alarm::Relay(tx.downgrade()),
        stop,
    )
    .await
    .unwrap();
    assert!(matches!(
        events.recv().await,
        Some(Err(PipelineError::NodeLeft { .. }))
    ));
}
