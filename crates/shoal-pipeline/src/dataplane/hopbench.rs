//! What a lane hop costs, apart from any model: `stages` threads in a ring of real loopback lanes (the
//! same [`Lane`] code a pipeline runs: sealed records, the [`Pacer`](super::wait::Pacer)'s waits), each
//! "computing" for a set time (a busy loop, ± a jitter) and then sending a message of a set size on to
//! the next, like a pipeline's stages passing one stream's activations and the last one's token back
//! to the first. A round's time less the compute in it is what the hops added; per hop it is that
//! divided by `stages`. Run by `examples/lane-hops.rs`; the figures are in docs/benchmarks.md.
//!
//! [`Transport::Tcp`] runs the same ring on bare loopback TCP (a length prefix, no sealing, readers
//! that never sleep): the floor any TCP hop has on the machine, to read the lanes' figures against.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use libp2p::PeerId;
use shoal_wire::{Activations, ChunkHeader, DType, Pool};

use super::lane::{LaneReader, LaneWriter, Received, loopback_pair, tcp_loopback_pair};
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
    pub transport: Transport,
}

/// What carries the ring's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Lanes, whose readers poll around the due time of their input ([`super::wait`]) when `pacing`,
    /// or sleep until it.
    Lane { pacing: bool },
    /// Bare loopback TCP, each reader polling without a pause: the floor of a TCP hop.
    Tcp,
}

/// The sending end of one hop.
enum Out {
    Lane(LaneWriter),
    Tcp(TcpStream),
}

/// The receiving end of one hop (a bare socket's bytes read so far with it).
enum In {
    Lane(Box<LaneReader>),
    Tcp(TcpStream, Vec<u8>),
}

impl Out {
    fn send(&mut self, msg: &[u8]) -> Result<(), PipelineError> {
        match self {
            Out::Lane(w) => w.send(msg),
            Out::Tcp(s) => {
                let mut buf = (msg.len() as u32).to_le_bytes().to_vec();
                buf.extend_from_slice(msg);
                s.write_all(&buf).map_err(io)
            }
        }
    }
}

impl In {
    /// Waits for the next message; `false` when the ring closed.
    fn recv(&mut self) -> Result<bool, PipelineError> {
        match self {
            In::Lane(r) => match r.recv(None) {
                Received::Inbound(Ok(_)) => Ok(true),
                Received::Inbound(Err(e)) => Err(e),
                _ => Ok(false),
            },
            In::Tcp(s, buf) => loop {
                if let Some(len) = buf
                    .get(..4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    && buf.len() >= 4 + len as usize
                {
                    buf.drain(..4 + len as usize);
                    return Ok(true);
                }
                let mut chunk = [0u8; 8192];
                match s.read(&mut chunk) {
                    Ok(0) => return Ok(false),
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                    Err(e) => return Err(io(e)),
                }
            },
        }
    }
}

fn io(e: std::io::Error) -> PipelineError {
    PipelineError::StreamBroke {
        peer: PeerId::random(),
        source: e,
    }
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

/// One hop over a fresh loopback connection: the sending end and the receiving end.
fn hop(transport: Transport) -> std::io::Result<(Out, In)> {
    match transport {
        Transport::Lane { pacing } => {
            let (tx, mut rx) = loopback_pair(&[1; 32])?;
            rx.reader.pace(pacing);
            Ok((Out::Lane(tx.writer), In::Lane(Box::new(rx.reader))))
        }
        Transport::Tcp => {
            let (a, b) = tcp_loopback_pair()?;
            b.set_nonblocking(true)?;
            Ok((Out::Tcp(a), In::Tcp(b, Vec::new())))
        }
    }
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
    // Lane i carries stage i's output to stage i + 1 (the last one's back to stage 0).
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..n {
        let (w, r) = hop(b.transport).map_err(io)?;
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
                } else if !r.recv()? {
                    return Ok((computes, rounds));
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
                    drafted: 0,
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
                    if !r.recv()? {
                        return Ok((computes, rounds));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transport_carries_the_ring_and_measures_each_round() {
        for transport in [
            Transport::Lane { pacing: true },
            Transport::Lane { pacing: false },
            Transport::Tcp,
        ] {
            let bench = HopBench {
                stages: 2,
                compute: Duration::from_micros(300),
                jitter: 0.05,
                hidden: 576,
                warmup: 3,
                rounds: 20,
                transport,
            };
            let f = run(&bench).unwrap_or_else(|e| panic!("{transport:?}: {e}"));
            assert_eq!(f.added_us.len(), 20, "{transport:?}");
            assert!(f.added_us.is_sorted(), "{transport:?}");
            // A loopback hop takes microseconds; under 100 ms even on a loaded machine.
            assert!(f.quantile(0.5) < 1e5, "{transport:?}: {:?}", f.added_us);
        }
    }
}
