//! Unit tests of the stage side: held frames, replayed KV operations.

use std::cell::RefCell;

use super::*;

fn release(seq_id: u64) -> Inbound {
    Ok(Frame::Release {
        seq_ids: vec![seq_id],
    })
}

#[test]
fn held_frames_go_out_together_and_only_when_no_input_waits() {
    let (tx, input) = mpsc::channel(4);
    let mut input = Inlet::Relay(input);
    tx.try_send(release(1)).unwrap();
    let sent = RefCell::new(Vec::new());
    let mut send = |bytes: Vec<u8>| {
        sent.borrow_mut().push(bytes);
        true
    };
    let mut held = Vec::new();
    append(&mut held, vec![1, 2]);
    append(&mut held, vec![3]);
    // A frame is waiting: it comes first and nothing is sent yet.
    match recv_or_flush(&mut input, &mut held, &mut send) {
        Some(Ok(Frame::Release { seq_ids })) => assert_eq!(seq_ids, [1]),
        other => panic!("expected the waiting frame, got {other:?}"),
    }
    assert!(sent.borrow().is_empty());
    // Nothing waiting: what is held goes out, as one message, before the thread waits (here the
    // upstream closes, which ends the stage).
    drop(tx);
    assert!(recv_or_flush(&mut input, &mut held, &mut send).is_none());
    assert_eq!(*sent.borrow(), [vec![1, 2, 3]]);
    assert!(held.is_empty());
}

#[test]
fn a_downstream_that_refuses_the_held_frames_ends_the_stage() {
    let (_tx, input) = mpsc::channel::<Inbound>(4);
    let mut input = Inlet::Relay(input);
    let mut held = vec![9];
    assert!(recv_or_flush(&mut input, &mut held, &mut |_| false).is_none());
}

#[test]
fn prefix_operations_applied_twice_leave_what_once_did() {
    let path = shoal_testkit::fixtures::model_path();
    let pool = std::sync::Arc::new(shoal_kernels::ThreadPool::new(1));
    let range = shoal_model::LayerRange { start: 0, end: 1 };
    let mut stage = shoal_engine::engine::load_local_stage(&path, range, &pool).unwrap();
    let chunk = |seq_id, len| ChunkSpec {
        seq_id,
        len,
        want_logits: false,
        pool: shoal_engine::stage::Pool::None,
    };
    stage
        .forward(
            &[chunk(1, 4)],
            StageData::Tokens(vec![1, 504, 3458, 282]),
            &[],
        )
        .unwrap();
    // Each operation as the stage sees it the first time, then again as a replay sends it.
    let ops = [
        KvOp::Fork {
            seq_id: 1,
            into: 2,
            len: 3,
        },
        KvOp::Release { seq_id: 1 },
        KvOp::Retain {
            seq_id: 2,
            prefix_id: 9,
            len: 3,
        },
        KvOp::Start {
            prefix_id: 9,
            seq_id: 3,
            len: 2,
        },
        KvOp::DropPrefix { prefix_id: 9 },
    ];
    for (i, op) in ops.iter().enumerate() {
        assert!(!already_applied(&stage, *op), "{op:?} not applied yet");
        stage.kv(*op).unwrap();
        // Everything applied so far, sent again in order: nothing fails, nothing changes.
        for again in &ops[..=i] {
            if !already_applied(&stage, *again) {
                stage.kv(*again).unwrap();
            }
        }
    }
    assert_eq!(
        (
            stage.cached_len(1),
            stage.cached_len(2),
            stage.cached_len(3)
        ),
        (0, 0, 2)
    );
    assert!(!stage.has_prefix(9));
}
