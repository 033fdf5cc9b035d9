//! Unit tests of the stage side: held frames, replayed KV operations.

use std::cell::RefCell;

use super::*;
use shoal_engine::stage::ChunkSpec;

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
    let mut stage: HybridStage = shoal_engine::engine::load_local_stage(&path, range, &pool)
        .unwrap()
        .into();
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

/// A stage of layer 1 of the test model (not the last: it passes hidden states on) as a node hosts
/// it, fed frame by frame as its upstream thread would.
struct Fed {
    host: HostedStage,
    stage: HybridStage,
    jobs: HashMap<u64, Vec<SampleJob>>,
}

impl Fed {
    fn new() -> Self {
        let path = shoal_testkit::fixtures::model_path();
        let pool = Arc::new(shoal_kernels::ThreadPool::new(1));
        let range = shoal_model::LayerRange { start: 1, end: 2 };
        let stage = shoal_engine::engine::load_local_stage(&path, range, &pool).unwrap();
        let bytes = stage.kv_bytes_per_token();
        let kv_pool = Arc::new(shoal_engine::kvpool::KvPool::new(1024 * bytes));
        let share = KvShare::reserve(&kv_pool, bytes, bytes).unwrap();
        let next = Some(PeerId::random());
        let host = HostedStage::new(
            shoal_ids::InstanceId::from_u64(1),
            1,
            (1, 2),
            next,
            stage,
            share,
        );
        let stage = host.take_stage(None).unwrap();
        let jobs = HashMap::new();
        Self { host, stage, jobs }
    }

    /// Applies encoded frames in order; what the stage passes on.
    fn apply(&mut self, bytes: &[u8]) -> Vec<Frame> {
        let mut reader = shoal_wire::FrameReader::new(DEFAULT_MAX_FRAME_LEN);
        reader.push(bytes);
        let mut out = Vec::new();
        while let Some(frame) = reader.next_frame().unwrap() {
            let passed = step(&mut self.stage, &self.host, &mut self.jobs, frame, false)
                .unwrap_or_else(|e| panic!("a frame failed: {e}"));
            out.extend(passed.map(|b| decode_one(&b)));
        }
        out
    }
}

fn decode_one(bytes: &[u8]) -> Frame {
    let mut reader = shoal_wire::FrameReader::new(DEFAULT_MAX_FRAME_LEN);
    reader.push(bytes);
    reader.next_frame().unwrap().expect("one whole frame")
}

/// The driver's side: layer 0 run here, its hidden states encoded as batch `batch_id` of `chunks`
/// (sequence, tokens), each starting where the driver's cache of it ends.
fn batch(
    head: &mut shoal_engine::stage::LocalStage,
    batch_id: u64,
    chunks: &[(u64, &[u32])],
) -> Vec<u8> {
    let specs: Vec<ChunkSpec> = chunks
        .iter()
        .map(|&(seq_id, t)| ChunkSpec {
            seq_id,
            len: t.len(),
            want_logits: false,
            pool: shoal_engine::stage::Pool::None,
        })
        .collect();
    let headers: Vec<shoal_wire::ChunkHeader> = chunks
        .iter()
        .map(|&(seq_id, t)| shoal_wire::ChunkHeader {
            seq_id,
            start_pos: head.cached_len(seq_id) as u32,
            len: t.len() as u32,
            want_logits: false,
            pool: shoal_wire::Pool::None,
            drafted: 0,
        })
        .collect();
    let tokens = chunks.iter().flat_map(|c| c.1.iter().copied()).collect();
    let StageData::Hidden(h) = head
        .forward(&specs, StageData::Tokens(tokens), &[])
        .unwrap()
    else {
        panic!("layer 0 passes hidden states on");
    };
    let mut bytes = Vec::new();
    Activations::encode_f32_into(
        &mut bytes,
        batch_id,
        &headers,
        h.cols() as u32,
        h.data(),
        shoal_wire::DType::F32,
    )
    .unwrap();
    bytes
}

/// Row `row` of an activations frame.
fn row(frame: &Frame, row: usize) -> Vec<f32> {
    let Frame::Activations(a) = frame else {
        panic!("expected activations, got {frame:?}");
    };
    let cols = a.shape[1] as usize;
    a.to_f32().unwrap()[row * cols..][..cols].to_vec()
}

/// Regression: a driver's path is cut while a batch is unconfirmed, after which one of its sequences
/// was released and another retained as a prefix — both applied by this stage before the cut. The
/// replay (the sequences rewound, the batch and the operations sent again) applies without an error
/// (it used to find no KV for the released sequence and fail the pipeline); the batch's live
/// sequence computes what it did the first time; and afterwards the stage answers exactly as one that
/// never saw the cut: same KV held, the prefix's contents unchanged, no placeholder left.
#[test]
fn a_replay_after_a_release_and_a_retain_leaves_the_stage_as_without_the_cut() {
    use super::super::kv_frame;
    use super::super::path::Replay;
    let path = shoal_testkit::fixtures::model_path();
    let pool = Arc::new(shoal_kernels::ThreadPool::new(1));
    let range = shoal_model::LayerRange { start: 0, end: 1 };
    let mut head = shoal_engine::engine::load_local_stage(&path, range, &pool).unwrap();
    let (mut clean, mut cut) = (Fed::new(), Fed::new());
    let mut replay = Replay::default();
    let prompts: [(u64, &[u32]); 3] = [
        (7, &[1, 504, 3458, 282, 4193]),
        (8, &[1, 9690, 28, 260, 3458]),
        (9, &[1, 2683, 314, 253, 1345]),
    ];
    let b1 = batch(&mut head, 1, &prompts);
    replay.batch(1, vec![(7, 0), (8, 0), (9, 0)], vec![b1.clone()]);
    for f in [&mut clean, &mut cut] {
        f.apply(&b1);
    }
    replay.answered(1);
    let b2 = batch(&mut head, 2, &[(7, &[30]), (8, &[31]), (9, &[32])]);
    replay.batch(2, vec![(7, 5), (8, 5), (9, 5)], vec![b2.clone()]);
    let first = cut.apply(&b2);
    clean.apply(&b2);
    // After batch 2, before its tokens came back: 7 released (a cancelled request), 8 kept as prefix 50.
    for op in [
        KvOp::Release { seq_id: 7 },
        KvOp::Retain {
            seq_id: 8,
            prefix_id: 50,
            len: 6,
        },
    ] {
        head.kv(op).unwrap();
        let frame = encode(&kv_frame(op)).unwrap();
        replay.kv(frame.clone());
        for f in [&mut clean, &mut cut] {
            f.apply(&frame);
        }
    }
    // The cut: everything unconfirmed again, on the new stream.
    let again: Vec<u8> = replay.frames().unwrap().concat();
    let passed = cut.apply(&again);
    let redone = passed
        .iter()
        .find(|f| matches!(f, Frame::Activations(a) if a.batch_id == 2))
        .expect("batch 2 computed again");
    assert_eq!(
        row(redone, 2),
        row(&first[0], 2),
        "sequence 9's hidden state"
    );
    assert!(!cut.stage.is_placeholder(7) && !cut.stage.is_placeholder(8));
    for (seq, len) in [(7, 0), (8, 0), (9, 6)] {
        assert_eq!(cut.stage.cached_len(seq), len, "sequence {seq}");
    }
    assert_eq!(cut.stage.held_tokens(), clean.stage.held_tokens());
    // The kept prefix and the live sequence go on exactly as on the stage that saw no cut.
    let start = KvOp::Start {
        prefix_id: 50,
        seq_id: 60,
        len: 6,
    };
    head.kv(start).unwrap();
    let frame = encode(&kv_frame(start)).unwrap();
    let b3 = batch(&mut head, 3, &[(60, &[33]), (9, &[34])]);
    let [after_cut, without] = [&mut cut, &mut clean].map(|f| {
        f.apply(&frame);
        f.apply(&b3)
    });
    assert_eq!(after_cut, without);
}
