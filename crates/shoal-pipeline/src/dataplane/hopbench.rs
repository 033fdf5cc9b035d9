//! What a lane hop costs, apart from any model: `stages` threads in a ring of real loopback lanes (the
//! same [`Lane`] code a pipeline runs: sealed records, the [`Pacer`](super::wait::Pacer)'s waits), each
//! "computing" for a set time (a busy loop, ± a jitter) and then sending a message of a set size on to
//! the next, like a pipeline's stages passing one stream's activations and the last one's token back
//! to the first. A round's time less the compute in it is what the hops added; per hop it is that
//! divided by `stages`. Run by `examples/lane-hops.rs`; the figures are in docs/benchmarks.md.

use std::time::{Duration, Instant};

use libp2p::PeerId;
use shoal_wire::{Activations, ChunkHeader, DType, Pool};

use super::lane::{LaneReader, LaneWriter, Received, loopback_pair};
use crate::error::PipelineError;

/// What to run.
#[derive(Debug, Clone)]
pub struct HopBench {
    pub stages: usize,
    /// Each stage's compute per step.
    pub compute: Duration,
    /// Each step's compute varies by up to this share either way.
    pub jitter: f64,
    /// Each message is one token's activations of this width, in f16 (SmolLM2: 576, 1,185 bytes).
    pub hidden: usize,
    pub warmup: usize,
    pub rounds: usize,
    /// Whether readers poll around the due time of their input ([`super::wait`]), or sleep until it.
    pub pacing: bool,
}

/// Per hop: what each measured round added beyond its compute, microseconds, sorted.
#[derive(Debug, Clone)]
pub struct HopFigures {
    pub added_us: Vec<f64>,
}

impl HopFigures {
    /// The `q` quantile (0..=1) of the added time per hop.
    pub fn quantile(&self, q: f64) -> f64 {
        let n = self.added_us.len();
        if n == 0 {
            return f64::NAN;
        }
        self.added_us[((n - 1) as f64 * q).round() as usize]
    }
}

/// A lane over a fresh loopback connection: the sending end and the receiving end.
fn lane_pair(pacing: bool) -> std::io::Result<(LaneWriter, LaneReader)> {
    let (tx, mut rx) = loopback_pair(&[1; 32])?;
    rx.reader.pace(pacing);
    Ok((tx.writer, rx.reader))
}

/// Busy for about `d` (as a stage computing).
fn busy(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// Runs the ring and measures it.
pub fn run(b: &HopBench) -> Result<HopFigures, PipelineError> {
    let n = b.stages.max(1);
    let io = |e: std::io::Error| PipelineError::StreamBroke {
        peer: PeerId::random(),
        source: e,
    };
    // Lane i carries stage i's output to stage i + 1 (the last one's back to stage 0).
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..n {
        let (w, r) = lane_pair(b.pacing).map_err(io)?;
        writers.push(w);
        readers.push(r);
    }
    readers.rotate_right(1); // stage i reads lane i − 1
    let total = b.warmup + b.rounds;
    let hidden = vec![0.5f32; b.hidden];
    let mut threads = Vec::new();
    let mut first = None;
    for (i, (mut w, mut r)) in writers.into_iter().zip(readers).enumerate() {
        let (hidden, b) = (hidden.clone(), b.clone());
        // Each stage's compute per step, and (stage 0) each round's time.
        let stage = move || -> Result<(Vec<Duration>, Vec<Duration>), PipelineError> {
            let mut seed = 0x9e37_79b9_u64.wrapping_mul(i as u64 + 1);
            let mut rounds = Vec::with_capacity(total);
            let mut computes = Vec::with_capacity(total);
            let mut started = Instant::now();
            for k in 0..total {
                if i == 0 {
                    started = Instant::now();
                } else {
                    match r.recv(None) {
                        Received::Inbound(Ok(_)) => {}
                        Received::Inbound(Err(e)) => return Err(e),
                        _ => return Ok((computes, rounds)),
                    }
                }
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let unit = (seed >> 11) as f64 / (1u64 << 53) as f64;
                let d = b.compute.mul_f64(1.0 + b.jitter * (2.0 * unit - 1.0));
                let t = Instant::now();
                busy(d);
                computes.push(t.elapsed());
                let chunk = ChunkHeader {
                    seq_id: 1,
                    start_pos: k as u32,
                    len: 1,
                    want_logits: true,
                    pool: Pool::None,
                };
                let mut msg = Vec::new();
                Activations::encode_f32_into(
                    &mut msg,
                    k as u64,
                    &[chunk],
                    b.hidden as u32,
                    &hidden,
                    DType::F16,
                )?;
                w.send(&msg)?;
                if i == 0 {
                    match r.recv(None) {
                        Received::Inbound(Ok(_)) => {}
                        Received::Inbound(Err(e)) => return Err(e),
                        _ => return Ok((computes, rounds)),
                    }
                    rounds.push(started.elapsed());
                }
            }
            Ok((computes, rounds))
        };
        if i == 0 {
            first = Some(stage);
        } else {
            threads.push(std::thread::spawn(stage));
        }
    }
    let (compute0, rounds) = first.map(|mut f| f()).transpose()?.unwrap_or_default();
    let mut computes = vec![compute0];
    for t in threads {
        if let Ok(Ok((c, _))) = t.join() {
            computes.push(c);
        }
    }
    // A round's time less every stage's compute in it.
    let mut added_us: Vec<f64> = (b.warmup..rounds.len())
        .map(|k| {
            let compute: Duration = computes.iter().filter_map(|c| c.get(k)).sum();
            rounds[k].saturating_sub(compute).as_secs_f64() * 1e6 / n as f64
        })
        .collect();
    added_us.sort_by(f64::total_cmp);
    Ok(HopFigures { added_us })
}
