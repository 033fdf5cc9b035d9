//! [`SampleJob`]: how the last stage samples one sequence of a batch, and its byte layout.

use crate::WireError;
use crate::cursor::Cursor;
use crate::sampling::SamplingParams;

/// Encoded size of a [`SampleJob`] without its history, counts, mask, draft and draft masks.
pub const SAMPLE_JOB_FIXED_LEN: usize = 65;

/// How the last stage must sample one sequence of a batch: the request's sampling parameters and the
/// sampler's state (random generator, penalty context) and the tokens a constraint allows, so the last
/// stage samples exactly as the request owner would and keeps no per-sequence state of its own.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleJob {
    pub seq_id: u64,
    /// The request's knobs; `seed` does not travel (`rng_state` does), so it decodes as `None`.
    pub params: SamplingParams,
    /// The random generator's state.
    pub rng_state: u64,
    /// The sequence's last tokens (for the repetition penalty).
    pub history: Vec<u32>,
    /// Generated-token counts (for the frequency and presence penalties).
    pub counts: Vec<(u32, u32)>,
    /// The tokens allowed next (constrained decoding): bit `t % 32` of word `t / 32` is token `t`;
    /// empty = no constraint.
    pub mask: Vec<u32>,
    /// Drafted tokens to verify (speculative decoding, version 6): the chunk fed them after the
    /// sequence's last token and wants a logits row for each position; empty = sample one token.
    pub draft: Vec<u32>,
    /// What the constraint allows after each drafted token (as `mask`, one per drafted token; an
    /// empty one: no constraint there); empty = unconstrained.
    pub draft_masks: Vec<Vec<u32>>,
}

/// Bytes of `job` on the wire.
pub(crate) fn sample_job_len(job: &SampleJob) -> u64 {
    let masks: usize = job.draft_masks.iter().map(|m| 4 + 4 * m.len()).sum();
    (SAMPLE_JOB_FIXED_LEN
        + 4 * job.history.len()
        + 8 * job.counts.len()
        + 4 * job.mask.len()
        + 4 * job.draft.len()
        + masks) as u64
}

pub(crate) fn write_sample_job(j: &SampleJob, out: &mut Vec<u8>) {
    let p = &j.params;
    out.extend_from_slice(&j.seq_id.to_le_bytes());
    for f in [p.temperature, p.top_p] {
        out.extend_from_slice(&f.to_le_bytes());
    }
    out.extend_from_slice(&p.top_k.to_le_bytes());
    for f in [
        p.min_p,
        p.repetition_penalty,
        p.frequency_penalty,
        p.presence_penalty,
    ] {
        out.extend_from_slice(&f.to_le_bytes());
    }
    out.push(p.top_logprobs);
    out.extend_from_slice(&j.rng_state.to_le_bytes());
    out.extend_from_slice(&(j.history.len() as u32).to_le_bytes());
    for t in &j.history {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&(j.counts.len() as u32).to_le_bytes());
    for (t, n) in &j.counts {
        out.extend_from_slice(&t.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
    write_words(out, &j.mask);
    write_words(out, &j.draft);
    out.extend_from_slice(&(j.draft_masks.len() as u32).to_le_bytes());
    for m in &j.draft_masks {
        write_words(out, m);
    }
}

/// A count and that many little-endian words.
fn write_words(out: &mut Vec<u8>, words: &[u32]) {
    out.extend_from_slice(&(words.len() as u32).to_le_bytes());
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

/// [`write_words`]' inverse.
fn read_words(c: &mut Cursor<'_>) -> Result<Vec<u32>, WireError> {
    let n = c.count(4)?;
    let mut words = Vec::with_capacity(n);
    for _ in 0..n {
        words.push(c.u32()?);
    }
    Ok(words)
}

pub(crate) fn decode_sample_job(c: &mut Cursor<'_>) -> Result<SampleJob, WireError> {
    let seq_id = c.u64()?;
    let params = SamplingParams {
        temperature: c.f32()?,
        top_p: c.f32()?,
        top_k: c.u32()?,
        min_p: c.f32()?,
        repetition_penalty: c.f32()?,
        frequency_penalty: c.f32()?,
        presence_penalty: c.f32()?,
        seed: None,
        top_logprobs: c.u8()?,
    };
    let rng_state = c.u64()?;
    let n = c.count(4)?;
    let mut history = Vec::with_capacity(n);
    for _ in 0..n {
        history.push(c.u32()?);
    }
    let n = c.count(8)?;
    let mut counts = Vec::with_capacity(n);
    for _ in 0..n {
        counts.push((c.u32()?, c.u32()?));
    }
    let mask = read_words(c)?;
    let draft = read_words(c)?;
    let n = c.count(4)?;
    let mut draft_masks = Vec::with_capacity(n);
    for _ in 0..n {
        draft_masks.push(read_words(c)?);
    }
    Ok(SampleJob {
        seq_id,
        params,
        rng_state,
        history,
        counts,
        mask,
        draft,
        draft_masks,
    })
}
