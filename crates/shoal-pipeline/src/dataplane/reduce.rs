//! The all-reduce of a tensor-parallel group (issue 31, decision 024): each member's partial sum of a
//! layer's output, sent to every other member over a lane, and the whole added in rank order — so every
//! member computes the same bits, and the result differs from one node's only by that order of
//! additions. A direct exchange (n − 1 sends a member) rather than a ring: at these sizes (a token's
//! hidden state, 2–28 KB) latency rules, and a direct exchange costs one one-way hop.
//!
//! Small messages (a decode step's) are written to every peer and then read: they fit the sockets'
//! buffers, so no member blocks on a peer that is itself writing. Larger ones (a prefill chunk's) are
//! written by a scoped thread while the member reads, so two members writing megabytes to each other
//! never wait on each other.
//!
//! Partials travel as [`Frame::Activations`] in f32 (exact), the round number as the batch id, so a
//! member that fell out of step is an error ([`PipelineError::OtherBatch`]), never a wrong sum.

use std::time::{Duration, Instant};

use shoal_wire::{Activations, ChunkHeader, DType, Frame, Pool};

use super::lane::{LaneReader, LaneWriter, Received, loopback_pair};
use crate::error::PipelineError;

/// Messages up to this size are written before any is read (they fit a loopback or LAN socket's
/// buffers); larger ones are written by a thread of their own.
const INLINE_BYTES: usize = 32 * 1024;

/// How long a member waits for a peer's partial before the group is taken as broken.
const REDUCE_TIMEOUT: Duration = Duration::from_secs(30);

/// One member's end of a group's all-reduce: a lane to and from every other member.
pub struct AllReduce {
    rank: usize,
    members: usize,
    /// Per other member, by rank: the lane's two halves.
    writers: Vec<(usize, LaneWriter)>,
    readers: Vec<(usize, LaneReader)>,
    round: u64,
    msg: Vec<u8>,
    /// Every member's partial of this round, by rank.
    parts: Vec<Vec<f32>>,
    /// Time spent in [`AllReduce::reduce`] and how many calls.
    spent: Duration,
    calls: u64,
}

impl AllReduce {
    /// Member `rank` of `members`, with a lane `(rank, writer, reader)` to each other member.
    pub(super) fn new(
        rank: usize,
        members: usize,
        links: Vec<(usize, LaneWriter, LaneReader)>,
    ) -> Self {
        let (mut writers, mut readers) = (Vec::new(), Vec::new());
        for (r, w, rd) in links {
            writers.push((r, w));
            readers.push((r, rd));
        }
        Self {
            rank,
            members,
            writers,
            readers,
            round: 0,
            msg: Vec::new(),
            parts: vec![Vec::new(); members],
            spent: Duration::ZERO,
            calls: 0,
        }
    }

    /// The members of a group of `n` in one process, every pair joined by a loopback lane keyed as a
    /// real lane is (benchmarks and tests).
    pub fn loopback(n: usize) -> std::io::Result<Vec<AllReduce>> {
        let mut links: Vec<Vec<(usize, LaneWriter, LaneReader)>> =
            (0..n).map(|_| Vec::new()).collect();
        for i in 0..n {
            for j in i + 1..n {
                let (a, b) = loopback_pair(&[(i * n + j) as u8; 32])?;
                links[i].push((j, a.writer, a.reader));
                links[j].push((i, b.writer, b.reader));
            }
        }
        Ok(links
            .into_iter()
            .enumerate()
            .map(|(rank, l)| AllReduce::new(rank, n, l))
            .collect())
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many members the group has.
    pub fn members(&self) -> usize {
        self.members
    }

    /// Time spent in [`AllReduce::reduce`] so far (sending, waiting for the slowest member, adding)
    /// and the number of calls.
    pub fn spent(&self) -> (Duration, u64) {
        (self.spent, self.calls)
    }

    /// Writes `bytes` (encoded frames) to every other member, between rounds: rank 0 sends a batch's
    /// input and its KV operations this way, ahead of that batch's partial sums.
    pub(super) fn send_all(&mut self, bytes: &[u8]) -> Result<(), PipelineError> {
        for (_, w) in self.writers.iter_mut() {
            w.send(bytes)?;
        }
        Ok(())
    }

    /// The next frame from member `rank` between rounds (what [`AllReduce::send_all`] sent), waiting
    /// until `deadline` (`None`: until it comes or the lane closes).
    pub(super) fn recv_from(&mut self, rank: usize, deadline: Option<Instant>) -> Received {
        match self.readers.iter_mut().find(|(r, _)| *r == rank) {
            Some((_, r)) => r.recv(deadline),
            None => Received::Closed,
        }
    }

    /// What wakes this member's readers (a group torn down while it waits).
    pub(super) fn interrupts(&self) -> Vec<std::sync::Weak<super::lane::Interrupt>> {
        self.readers.iter().map(|(_, r)| r.interrupt()).collect()
    }

    /// Makes `partial` (`rows × cols`, this member's) the sum of every member's, added in rank order.
    pub fn reduce(&mut self, partial: &mut [f32], cols: usize) -> Result<(), PipelineError> {
        let started = Instant::now();
        let result = self.exchange(partial, cols);
        self.spent += started.elapsed();
        self.calls += 1;
        result
    }

    fn exchange(&mut self, partial: &mut [f32], cols: usize) -> Result<(), PipelineError> {
        if self.members == 1 {
            return Ok(());
        }
        // Rows of `cols` (hidden states), or one row (a split head's logits, `rows × vocab`).
        let cols = if cols > 0 && partial.len().is_multiple_of(cols) {
            cols
        } else {
            partial.len()
        };
        let rows = partial.len() / cols.max(1);
        self.round += 1;
        let chunk = ChunkHeader {
            seq_id: 0,
            start_pos: 0,
            len: rows as u32,
            want_logits: false,
            pool: Pool::None,
            drafted: 0,
        };
        self.msg.clear();
        Activations::encode_f32_into(
            &mut self.msg,
            self.round,
            &[chunk],
            cols as u32,
            partial,
            DType::F32,
        )?;
        let (round, msg) = (self.round, &self.msg);
        let (writers, readers, parts) = (&mut self.writers, &mut self.readers, &mut self.parts);
        if msg.len() <= INLINE_BYTES {
            for (_, w) in writers.iter_mut() {
                w.send(msg)?;
            }
            receive(readers, parts, round, partial.len())?;
        } else {
            std::thread::scope(|s| {
                let sent = s.spawn(|| -> Result<(), PipelineError> {
                    for (_, w) in writers.iter_mut() {
                        w.send(msg)?;
                    }
                    Ok(())
                });
                let got = receive(readers, parts, round, partial.len());
                let sent = sent.join().unwrap_or(Err(PipelineError::StreamClosed {
                    what: "all-reduce writer",
                }));
                got.and(sent)
            })?;
        }
        parts[self.rank].clear();
        parts[self.rank].extend_from_slice(partial);
        partial.copy_from_slice(&parts[0]);
        for p in &parts[1..] {
            for (x, v) in partial.iter_mut().zip(p) {
                *x += v;
            }
        }
        Ok(())
    }
}

/// Each peer's partial of `round` (`len` values) into `parts` by rank.
fn receive(
    readers: &mut [(usize, LaneReader)],
    parts: &mut [Vec<f32>],
    round: u64,
    len: usize,
) -> Result<(), PipelineError> {
    let deadline = Instant::now() + REDUCE_TIMEOUT;
    for (rank, r) in readers.iter_mut() {
        let frame = match r.recv(Some(deadline)) {
            Received::Inbound(f) => f?,
            Received::Closed => {
                return Err(PipelineError::StreamClosed {
                    what: "all-reduce lane to a group member",
                });
            }
            Received::TimedOut => return Err(PipelineError::NoTokensInTime),
        };
        let Frame::Activations(a) = frame else {
            return Err(PipelineError::NotHidden);
        };
        if a.batch_id != round {
            return Err(PipelineError::OtherBatch {
                got: a.batch_id,
                want: round,
            });
        }
        let values = a.to_f32()?;
        if values.len() != len {
            return Err(PipelineError::NotHidden);
        }
        parts[*rank] = values;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three members' partials, small and large: every member ends with the same bits, the rank-order
    /// sum.
    #[test]
    fn every_member_gets_the_rank_order_sum() {
        for (rows, cols, n) in [(1, 64, 3), (1, 2048, 3), (64, 2048, 2), (8, 2048, 3)] {
            let group = AllReduce::loopback(n).unwrap();
            let partial = |rank: usize| -> Vec<f32> {
                (0..rows * cols)
                    .map(|i| ((i * 7 + rank * 13) % 101) as f32 * 0.37 - 17.0 + rank as f32 * 1e-3)
                    .collect()
            };
            let parts: Vec<Vec<f32>> = (0..n).map(partial).collect();
            let want: Vec<f32> = (0..rows * cols)
                .map(|i| {
                    (0..n).fold(
                        0.0,
                        |a, r| if r == 0 { parts[0][i] } else { a + parts[r][i] },
                    )
                })
                .collect();
            let got: Vec<Vec<f32>> = std::thread::scope(|s| {
                let handles: Vec<_> = group
                    .into_iter()
                    .map(|mut m| {
                        s.spawn(move || {
                            let mut p = partial(m.rank());
                            for _ in 0..3 {
                                // Three rounds: the round numbers stay in step.
                                p = partial(m.rank());
                                m.reduce(&mut p, cols).unwrap();
                            }
                            p
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for g in &got {
                assert!(g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }
}
