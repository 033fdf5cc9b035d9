//! Shared helpers for the integration tests: a tiny seeded RNG and sample frames.
#![allow(dead_code)]

use shoal_wire::{
    Activations, ChunkHeader, DType, Frame, PrefixAction, PrefixOp, SampleJob, TokenItem,
};

/// SplitMix64: deterministic, good enough to drive randomized tests.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }

    /// Roughly N(0, 1)-ish values in [-4, 4], like hidden states.
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
    }
}

pub fn chunks() -> Vec<ChunkHeader> {
    vec![
        ChunkHeader {
            seq_id: 7,
            start_pos: 0,
            len: 3,
            want_logits: false,
        },
        ChunkHeader {
            seq_id: u64::MAX,
            start_pos: 41,
            len: 1,
            want_logits: true,
        },
    ]
}

/// One frame of every kind.
pub fn sample_frames(rng: &mut Rng) -> Vec<Frame> {
    let cols = 5;
    let values: Vec<f32> = (0..4 * cols).map(|_| rng.f32()).collect();
    vec![
        Frame::Activations(
            Activations::from_f32(1, chunks(), cols as u32, &values, DType::F16).unwrap(),
        ),
        Frame::Activations(
            Activations::from_f32(2, chunks(), cols as u32, &values, DType::F32).unwrap(),
        ),
        Frame::Activations(Activations::from_f32(3, vec![], 576, &[], DType::F16).unwrap()),
        Frame::Tokens {
            batch_id: 9,
            items: vec![
                TokenItem {
                    seq_id: 7,
                    token: 49151,
                    logprob: -0.25,
                },
                TokenItem {
                    seq_id: u64::MAX,
                    token: 0,
                    logprob: f32::NEG_INFINITY,
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
                    temperature: 0.7,
                    top_p: 0.9,
                    top_k: 40,
                    min_p: 0.05,
                    repetition_penalty: 1.1,
                    frequency_penalty: -0.5,
                    presence_penalty: 2.0,
                    rng_state: u64::MAX - 1,
                    history: vec![1, 2, 49151],
                    counts: vec![(5, 1), (9, 300)],
                },
                SampleJob {
                    seq_id: 4,
                    temperature: 0.0,
                    top_p: 1.0,
                    top_k: 0,
                    min_p: 0.0,
                    repetition_penalty: 1.0,
                    frequency_penalty: 0.0,
                    presence_penalty: 0.0,
                    rng_state: 0,
                    history: vec![],
                    counts: vec![],
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
    ]
}
