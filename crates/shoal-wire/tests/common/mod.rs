//! Shared helpers for the integration tests: sample frames (and the testkit's seeded generator).
#![allow(dead_code)]

use shoal_wire::{
    Activations, ChunkHeader, DType, Frame, Inputs, Pool, Pooled, PrefixAction, PrefixOp,
    SampleJob, SamplingParams, TokenItem,
};

pub use shoal_testkit::rng::{Draw, SplitMix64 as Rng};

pub fn chunks() -> Vec<ChunkHeader> {
    vec![
        ChunkHeader {
            seq_id: 7,
            start_pos: 0,
            len: 3,
            want_logits: true,
            pool: Pool::Sum,
            drafted: 2,
        },
        ChunkHeader {
            seq_id: u64::MAX,
            start_pos: 41,
            len: 1,
            want_logits: true,
            pool: Pool::None,
            drafted: 0,
        },
    ]
}

/// One frame of every kind.
pub fn sample_frames(rng: &mut Rng) -> Vec<Frame> {
    let cols = 5;
    let values: Vec<f32> = (0..4 * cols).map(|_| rng.f32_in(-4.0, 4.0)).collect();
    vec![
        Frame::Activations(
            Activations::from_f32(1, chunks(), cols as u32, &values, DType::F16).unwrap(),
        ),
        Frame::Activations(
            Activations::from_f32(2, chunks(), cols as u32, &values, DType::F32).unwrap(),
        ),
        Frame::Activations(Activations::from_f32(3, vec![], 576, &[], DType::F16).unwrap()),
        Frame::Inputs(Inputs {
            batch_id: 4,
            chunks: chunks(),
            tokens: vec![0, 151_643, u32::MAX, 17],
        }),
        Frame::Tokens {
            batch_id: 9,
            items: vec![
                TokenItem {
                    seq_id: 7,
                    token: 49151,
                    logprob: -0.25,
                    top: vec![(49151, -0.25), (3, -1.5), (0, f32::NEG_INFINITY)],
                },
                TokenItem {
                    seq_id: u64::MAX,
                    token: 0,
                    logprob: f32::NEG_INFINITY,
                    top: vec![],
                },
            ],
        },
        Frame::Tokens {
            batch_id: 0,
            items: vec![],
        },
        Frame::Release {
            seq_ids: vec![1, 2, u64::MAX],
        },
        Frame::Release { seq_ids: vec![] },
        Frame::Lane {
            port: 52417,
            token: [7; 32],
        },
        Frame::Ping { nonce: 0xDEAD_BEEF },
        Frame::Pong { nonce: u64::MAX },
        Frame::Error {
            code: 503,
            message: "stage overloaded — réessayez".into(),
        },
        Frame::Error {
            code: 0,
            message: String::new(),
        },
        Frame::Sample {
            batch_id: 4,
            jobs: vec![
                SampleJob {
                    seq_id: 3,
                    params: SamplingParams {
                        temperature: 0.7,
                        top_p: 0.9,
                        top_k: 40,
                        min_p: 0.05,
                        repetition_penalty: 1.1,
                        frequency_penalty: -0.5,
                        presence_penalty: 2.0,
                        seed: None,
                        top_logprobs: 20,
                    },
                    rng_state: u64::MAX - 1,
                    history: vec![1, 2, 49151],
                    counts: vec![(5, 1), (9, 300)],
                    mask: vec![0xFFFF_0000, 0, u32::MAX],
                    draft: vec![7, 49151],
                    draft_masks: vec![vec![1, 2, 3], vec![]],
                },
                SampleJob {
                    seq_id: 4,
                    params: SamplingParams {
                        temperature: 0.0,
                        ..SamplingParams::default()
                    },
                    rng_state: 0,
                    history: vec![],
                    counts: vec![],
                    mask: vec![],
                    draft: vec![],
                    draft_masks: vec![],
                },
            ],
        },
        Frame::Sample {
            batch_id: 5,
            jobs: vec![],
        },
        Frame::Prefix(PrefixOp {
            action: PrefixAction::Retain,
            seq_id: 1,
            prefix_id: u64::MAX,
            len: 77,
        }),
        Frame::Prefix(PrefixOp {
            action: PrefixAction::Drop,
            seq_id: 0,
            prefix_id: 2,
            len: 0,
        }),
        Frame::Prefix(PrefixOp {
            action: PrefixAction::Fork,
            seq_id: 3,
            prefix_id: 4,
            len: 12,
        }),
        Frame::Prefix(PrefixOp {
            action: PrefixAction::Rewind,
            seq_id: 5,
            prefix_id: 0,
            len: 9,
        }),
        Frame::Prefix(PrefixOp {
            action: PrefixAction::Clear,
            seq_id: 0,
            prefix_id: 0,
            len: 0,
        }),
        Frame::Pooled(Pooled {
            batch_id: 6,
            seq_ids: vec![7, u64::MAX],
            cols: 3,
            values: vec![0.5, -1.0, 2.0, 1e-8, 0.0, -3.25],
        }),
        Frame::Pooled(Pooled {
            batch_id: 7,
            seq_ids: vec![],
            cols: 576,
            values: vec![],
        }),
    ]
}
