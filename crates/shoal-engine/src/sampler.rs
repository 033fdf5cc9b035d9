//! Token sampling: penalties, then greedy or top-k → top-p → min-p → temperature → draw.
//!
//! The order follows llama.cpp's default sampler chain. A [`Sampler`] owns its random generator, so the
//! same seed over the same logits gives the same tokens.

use std::collections::HashMap;

use shoal_kernels::rng::SplitMix64 as Rng;
use shoal_wire::SampleJob;

use crate::logits::TokenMask;
use crate::request::SamplingParams;

/// Tokens of history the repetition penalty looks at (llama.cpp's `penalty_last_n` default).
pub const REPETITION_WINDOW: usize = 64;

#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// Occurrences of each generated token (frequency / presence penalties).
    counts: HashMap<u32, u32>,
}

/// Log-probability of `id` under the softmax of `logits`.
pub fn logprob(logits: &[f32], id: u32) -> f32 {
    let l = logits
        .get(id as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    l - log_normalizer(logits)
}

/// `ln Σ exp(logits)`: a logit minus this is its log-probability (vectorized f32 exponentials summed
/// in f64: every token pays this over the whole vocabulary).
pub use shoal_kernels::math::log_normalizer;

/// The `k` most likely tokens of `logits` with their log-probabilities (`normalizer` is
/// [`log_normalizer`] of the row), best first, the lower id first on ties.
pub fn top_logprobs(logits: &[f32], k: usize, normalizer: f32) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return top;
    }
    for (i, &l) in logits.iter().enumerate() {
        if top.len() == k && top.last().is_some_and(|&(_, worst)| l <= worst) {
            continue;
        }
        // Insert after every value at least as large: ties keep the lower id first.
        let at = top.partition_point(|&(_, v)| v >= l);
        top.insert(at, (i as u32, l));
        top.truncate(k);
    }
    for t in &mut top {
        t.1 -= normalizer;
    }
    top
}

/// Index of the largest value (first one on ties).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    /// `fallback_seed` is used when the request gave no seed.
    pub fn new(params: SamplingParams, fallback_seed: u64) -> Self {
        let seed = params.seed.unwrap_or(fallback_seed);
        Self {
            params,
            rng: Rng::new(seed),
            counts: HashMap::new(),
        }
    }

    /// What a remote last stage needs to sample sequence `seq_id` exactly as this sampler would next:
    /// the parameters, the random generator's state, the penalties' context (the last
    /// [`REPETITION_WINDOW`] tokens of `history` when the repetition penalty is on, the generated-token
    /// counts when the frequency or presence penalty is). No draft: the caller adds one.
    pub fn job(&self, seq_id: u64, history: &[u32], mask: Option<&TokenMask>) -> SampleJob {
        let history = if self.params.repetition_penalty != 1.0 {
            history[history.len().saturating_sub(REPETITION_WINDOW)..].to_vec()
        } else {
            Vec::new()
        };
        SampleJob {
            seq_id,
            params: self.params.clone(),
            rng_state: self.rng_state(),
            history,
            counts: self.counts(),
            mask: mask.map_or_else(Vec::new, |m| m.words().to_vec()),
            draft: Vec::new(),
            draft_masks: Vec::new(),
        }
    }

    /// The sampler a [`SampleJob`] describes (its history is passed to [`Sampler::sample`]).
    pub fn from_job(job: &SampleJob) -> Self {
        Self {
            params: job.params.clone(),
            rng: Rng::new(job.rng_state),
            counts: job.counts.iter().copied().collect(),
        }
    }

    /// Alternatives to report with each token (see [`SamplingParams::top_logprobs`]).
    pub fn top_logprobs(&self) -> usize {
        self.params.top_logprobs as usize
    }

    /// Whether sampling changes the logits of tokens seen before (repetition, frequency or presence
    /// penalty).
    pub fn has_penalties(&self) -> bool {
        let p = &self.params;
        p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0
    }

    /// The random generator's state.
    pub fn rng_state(&self) -> u64 {
        self.rng.state()
    }

    /// Generated-token counts, sorted by token id (the frequency and presence penalties' input).
    pub fn counts(&self) -> Vec<(u32, u32)> {
        if self.params.frequency_penalty == 0.0 && self.params.presence_penalty == 0.0 {
            return Vec::new();
        }
        let mut c: Vec<(u32, u32)> = self.counts.iter().map(|(&t, &n)| (t, n)).collect();
        c.sort_unstable();
        c
    }

    /// Records a generated token for the frequency and presence penalties.
    pub fn accept(&mut self, id: u32) {
        *self.counts.entry(id).or_default() += 1;
    }

    /// Brings this sampler to the state it would have after sampling `id` itself: what the request
    /// owner does when another node (the pipeline's last stage) sampled from the same state.
    pub fn replay(&mut self, id: u32) {
        if self.params.temperature > 0.0 {
            // `sample` draws exactly one number when not greedy.
            self.rng.next_u64();
        }
        self.accept(id);
    }

    /// Picks the next token. `history` is the sequence so far (prompt and generated), used by the
    /// repetition penalty. `logits` is modified in place by the penalties.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.apply_penalties(logits, history);
        if self.params.temperature <= 0.0 {
            return argmax(logits);
        }
        let r = self.rng.next_f64();
        draw(logits, &self.params, r)
    }

    /// Whether this sampler picks the most likely token (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.params.temperature <= 0.0
    }

    /// Two uniform draws in [0, 1): what verifying one position of a drafted run takes when sampling
    /// (the acceptance test, then the draw from what is left), used or not, so the owner's replay
    /// ([`Sampler::replay_verified`]) never depends on the outcome.
    fn two_draws(&mut self) -> (f64, f64) {
        (self.rng.next_f64(), self.rng.next_f64())
    }

    /// [`Sampler::replay`] of a token picked while verifying a draft (two draws when sampling).
    pub fn replay_verified(&mut self, id: u32) {
        if self.params.temperature > 0.0 {
            self.rng.next_u64();
            self.rng.next_u64();
        }
        self.accept(id);
    }

    /// Verifies drafted token `draft` (or, with `None`, picks the bonus token past a fully accepted
    /// draft) over `logits` with the penalties and mask already applied: greedy takes the argmax
    /// (the draft is accepted when it is that); sampling accepts the draft with its probability
    /// under the distribution [`Sampler::sample`] draws from, and otherwise draws from that
    /// distribution with the draft taken out — so the token has exactly [`Sampler::sample`]'s
    /// distribution whatever the draft was. Sampling takes [`Sampler::two_draws`] every time.
    pub fn verify_pick(&mut self, logits: &[f32], draft: Option<u32>) -> u32 {
        if self.is_greedy() {
            return argmax(logits);
        }
        let (u, r) = self.two_draws();
        verify_draw(logits, &self.params, draft, u, r)
    }

    /// [`Sampler::sample`]'s penalties alone, in place.
    pub fn penalize(&self, logits: &mut [f32], history: &[u32]) {
        self.apply_penalties(logits, history);
    }

    fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            let start = history.len().saturating_sub(REPETITION_WINDOW);
            let mut seen = std::collections::HashSet::new();
            for &id in &history[start..] {
                if let Some(l) = logits.get_mut(id as usize)
                    && seen.insert(id)
                {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            for (&id, &n) in &self.counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= n as f32 * p.frequency_penalty + p.presence_penalty;
                }
            }
        }
    }
}

/// Candidates from the most likely down (ties: the smaller id first), ranked lazily: a vocabulary of
/// 50–250k tokens is sorted only as far as the cuts and the draw look, which for a model's peaked
/// distributions is a few dozen tokens (a full sort was ~20% of a small model's decode step).
struct Ranked<'a> {
    logits: &'a [f32],
    /// Candidate ids; `idx[..sorted]` is in order, and every later one ranks below them.
    idx: Vec<u32>,
    sorted: usize,
}

impl<'a> Ranked<'a> {
    /// Every token, or the `top_k` best when `top_k` > 0.
    fn new(logits: &'a [f32], top_k: u32) -> Self {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = top_k as usize;
        if k > 0 && k < idx.len() {
            idx.select_nth_unstable_by(k - 1, |&a, &b| rank(logits, a, b));
            idx.truncate(k);
        }
        Ranked {
            logits,
            idx,
            sorted: 0,
        }
    }

    /// The `i`-th best candidate and its logit (ranking more of them when needed).
    fn get(&mut self, i: usize) -> (u32, f32) {
        if i >= self.sorted {
            let logits = self.logits;
            let want = (i + 1).max(self.sorted * 4).max(64).min(self.idx.len());
            let rest = &mut self.idx[self.sorted..];
            let n = want - self.sorted;
            if n < rest.len() {
                rest.select_nth_unstable_by(n - 1, |&a, &b| rank(logits, a, b));
            }
            rest[..n].sort_unstable_by(|&a, &b| rank(logits, a, b));
            self.sorted = want;
        }
        let id = self.idx[i];
        (id, self.logits[id as usize])
    }

    /// Σ exp((logit − `max`) / `t`) over every candidate (in any order).
    fn exp_sum(&self, max: f64, t: f64) -> f64 {
        self.idx
            .iter()
            .map(|&i| ((self.logits[i as usize] as f64 - max) / t).exp())
            .sum()
    }
}

/// Descending logit, then ascending id.
fn rank(logits: &[f32], a: u32, b: u32) -> std::cmp::Ordering {
    logits[b as usize]
        .total_cmp(&logits[a as usize])
        .then(a.cmp(&b))
}

/// Candidates ranked, how many the cuts keep, the largest logit and the sum the temperature-scaled
/// probabilities of the kept ones are divided by: what [`draw`] and [`distribution`] share.
fn cut<'a>(logits: &'a [f32], p: &SamplingParams) -> Option<(Ranked<'a>, usize, f64, f64)> {
    let mut ranked = Ranked::new(logits, p.top_k);
    let m = ranked.idx.len();
    if m == 0 {
        return None;
    }
    let max = ranked.get(0).1 as f64;
    let mut keep = m;
    if p.top_p < 1.0 || p.min_p > 0.0 {
        let sum = ranked.exp_sum(max, 1.0);
        let floor = (1.0 / sum) * p.min_p as f64;
        let mut cum = 0.0;
        for i in 0..m {
            let pr = (ranked.get(i).1 as f64 - max).exp() / sum;
            if p.min_p > 0.0 && pr < floor {
                keep = i.max(1);
                break;
            }
            cum += pr;
            if p.top_p < 1.0 && cum >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    let t = p.temperature as f64;
    let sum = if keep == m {
        ranked.exp_sum(max, t)
    } else {
        (0..keep)
            .map(|i| ((ranked.get(i).1 as f64 - max) / t).exp())
            .sum()
    };
    Some((ranked, keep, max, sum))
}

/// Top-k → top-p → min-p → temperature, then the candidate where the cumulative probability passes
/// `r` (uniform in [0, 1)). The nucleus and min-p cut use the probabilities before temperature, as in
/// llama.cpp.
fn draw(logits: &[f32], p: &SamplingParams, r: f64) -> u32 {
    let Some((mut ranked, keep, max, sum)) = cut(logits, p) else {
        return 0;
    };
    let t = p.temperature as f64;
    let mut cum = 0.0;
    for i in 0..keep {
        let (id, l) = ranked.get(i);
        cum += ((l as f64 - max) / t).exp() / sum;
        if r < cum {
            return id;
        }
    }
    ranked.get(keep - 1).0
}

/// [`Sampler::verify_pick`] when sampling: `u` decides whether `draft` is accepted, `r` draws from
/// the rest (or from every candidate when there is no draft).
fn verify_draw(logits: &[f32], p: &SamplingParams, draft: Option<u32>, u: f64, r: f64) -> u32 {
    let Some(d) = draft else {
        return draw(logits, p, r);
    };
    let Some((mut ranked, keep, max, sum)) = cut(logits, p) else {
        return d;
    };
    let t = p.temperature as f64;
    let ld = logits.get(d as usize).copied().unwrap_or(f32::NEG_INFINITY);
    // The draft's rank among every token, in the order the cuts rank them (`rank`: ±0 and NaN
    // included): kept when the cuts keep that many.
    let above = (0..logits.len() as u32)
        .filter(|&i| rank(logits, i, d) == std::cmp::Ordering::Less)
        .count();
    let pd = if above < keep && ld > f32::NEG_INFINITY {
        ((ld as f64 - max) / t).exp() / sum
    } else {
        0.0
    };
    if u < pd {
        return d;
    }
    let target = r * (1.0 - pd);
    let mut cum = 0.0;
    let mut last = None;
    for i in 0..keep {
        let (id, l) = ranked.get(i);
        if id == d {
            continue;
        }
        cum += ((l as f64 - max) / t).exp() / sum;
        last = Some(id);
        if target < cum {
            return id;
        }
    }
    last.unwrap_or(d)
}

#[cfg(test)]
fn softmax(logits: impl Iterator<Item = f32> + Clone, temperature: f32) -> Vec<f64> {
    let t = temperature as f64;
    let max = logits.clone().fold(f32::NEG_INFINITY, f32::max) as f64;
    let exps: Vec<f64> = logits.map(|l| ((l as f64 - max) / t).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_picks_the_largest_logit() {
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 0.0,
                ..params()
            },
            1,
        );
        let mut logits = vec![0.1, 3.0, 2.9, -1.0];
        assert_eq!(s.sample(&mut logits, &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens_other_seed_differs() {
        let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = Sampler::new(
                SamplingParams {
                    seed: Some(seed),
                    ..params()
                },
                0,
            );
            (0..50)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(
            SamplingParams {
                top_k: 1,
                ..params()
            },
            3,
        );
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [1.0, 5.0, 4.9, 0.0], &[]), 1);
        }
    }

    #[test]
    fn top_p_cuts_the_tail() {
        // p ≈ [0.67, 0.24, 0.09, ...]: top_p 0.5 keeps only the first token.
        let mut s = Sampler::new(
            SamplingParams {
                top_p: 0.5,
                ..params()
            },
            11,
        );
        for _ in 0..50 {
            assert_eq!(s.sample(&mut [2.0, 1.0, 0.0, -5.0], &[]), 0);
        }
    }

    #[test]
    fn min_p_cuts_unlikely_tokens() {
        let mut s = Sampler::new(
            SamplingParams {
                min_p: 0.5,
                ..params()
            },
            5,
        );
        for _ in 0..50 {
            let t = s.sample(&mut [3.0, 2.9, -3.0, -3.0], &[]);
            assert!(t == 0 || t == 1, "drew {t}");
        }
    }

    #[test]
    fn low_temperature_concentrates_high_temperature_spreads() {
        let logits = vec![1.0, 0.5, 0.0];
        let count_top = |temp| {
            let mut s = Sampler::new(
                SamplingParams {
                    temperature: temp,
                    seed: Some(1),
                    ..params()
                },
                0,
            );
            (0..2000)
                .filter(|_| s.sample(&mut logits.clone(), &[]) == 0)
                .count()
        };
        let (cold, hot) = (count_top(0.1), count_top(2.0));
        assert!(cold > 1950, "cold {cold}");
        assert!(hot < 1000, "hot {hot}");
    }

    #[test]
    fn repetition_penalty_demotes_seen_tokens() {
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 0.0,
                repetition_penalty: 2.0,
                ..params()
            },
            0,
        );
        // Token 0 leads (2.0) but was seen: 2.0 / 2 = 1.0 < 1.5.
        assert_eq!(s.sample(&mut [2.0, 1.5], &[0]), 1);
        // Negative logits are pushed further down.
        let mut l = vec![-1.0, -1.5];
        s.apply_penalties(&mut l, &[0]);
        assert_eq!(l[0], -2.0);
    }

    #[test]
    fn frequency_and_presence_penalties_count_generated_tokens() {
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 0.0,
                frequency_penalty: 0.5,
                presence_penalty: 0.25,
                ..params()
            },
            0,
        );
        s.accept(0);
        s.accept(0);
        let mut l = vec![2.0, 0.9];
        // 2.0 - (2 * 0.5 + 0.25) = 0.75 < 0.9
        assert_eq!(s.sample(&mut l, &[]), 1);
        assert!((l[0] - 0.75).abs() < 1e-6);
    }

    #[test]
    fn a_sampler_rebuilt_from_its_job_draws_the_same_tokens() {
        let mut s = Sampler::new(
            SamplingParams {
                seed: Some(9),
                repetition_penalty: 1.3,
                presence_penalty: 0.5,
                ..params()
            },
            0,
        );
        s.accept(2);
        let history: Vec<u32> = (0..100).collect();
        let job = s.job(4, &history, Some(&TokenMask::banning(100, [7])));
        assert_eq!(job.seq_id, 4);
        assert_eq!(job.history, history[100 - REPETITION_WINDOW..]);
        assert_eq!(job.counts, [(2, 1)]);
        assert_eq!(job.mask, TokenMask::banning(100, [7]).into_words());
        let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.3).collect();
        let mut remote = Sampler::from_job(&job);
        for _ in 0..20 {
            let a = s.sample(&mut logits.clone(), &job.history);
            let b = remote.sample(&mut logits.clone(), &job.history);
            assert_eq!(a, b);
            s.accept(a);
            remote.accept(b);
        }
        // Without the penalties, no context travels.
        let plain = Sampler::new(params(), 0).job(1, &history, None);
        assert!(plain.history.is_empty() && plain.counts.is_empty() && plain.mask.is_empty());
    }

    #[test]
    fn logprob_matches_log_softmax() {
        let l = [1.0f32, 2.0, 3.0];
        let z: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        assert!((logprob(&l, 2) as f64 - (3.0 - z.ln())).abs() < 1e-5);
        // A vocabulary-sized row (several chunks and a partial one) with a wide spread of values.
        let l: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.037 - 20.0)
            .collect();
        let max = l.iter().copied().fold(f32::MIN, f32::max) as f64;
        let z: f64 = l.iter().map(|&x| (x as f64 - max).exp()).sum();
        for id in [0u32, 1, 500, 999] {
            let want = l[id as usize] as f64 - max - z.ln();
            assert!((logprob(&l, id) as f64 - want).abs() < 1e-5, "id {id}");
        }
        assert_eq!(
            logprob(&l, 5000),
            f32::NEG_INFINITY,
            "unknown ids are impossible"
        );
    }

    #[test]
    fn top_logprobs_are_the_best_tokens_in_order_with_their_logprobs() {
        let l: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.037 - 20.0)
            .collect();
        let norm = log_normalizer(&l);
        let top = top_logprobs(&l, 5, norm);
        let mut order: Vec<u32> = (0..1000).collect();
        order.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
        assert_eq!(
            top.iter().map(|t| t.0).collect::<Vec<_>>(),
            order[..5].to_vec()
        );
        for (id, lp) in &top {
            assert!((lp - logprob(&l, *id)).abs() < 1e-5);
        }
        // Ties keep the lower id first; asking for more than the row gives the whole row.
        let tied = top_logprobs(&[1.0, 3.0, 3.0, 0.0], 10, 0.0);
        assert_eq!(tied, [(1, 3.0), (2, 3.0), (0, 1.0), (3, 0.0)]);
        assert!(top_logprobs(&l, 0, norm).is_empty());
    }

    /// The sampler before ranking was lazy: every candidate sorted, probabilities over all of them.
    fn reference_draw(logits: &[f32], p: &SamplingParams, r: f64) -> u32 {
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let by = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && (p.top_k as usize) < cand.len() {
            cand.select_nth_unstable_by(p.top_k as usize - 1, by);
            cand.truncate(p.top_k as usize);
        }
        cand.sort_unstable_by(by);
        let probs = softmax(cand.iter().map(|c| c.1), 1.0);
        let mut keep = cand.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, &pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&pr| pr >= floor).count().max(1));
        }
        cand.truncate(keep.max(1));
        let probs = softmax(cand.iter().map(|c| c.1), p.temperature);
        let mut cum = 0.0;
        for (c, pr) in cand.iter().zip(&probs) {
            cum += pr;
            if r < cum {
                return c.0;
            }
        }
        cand.last().map(|c| c.0).unwrap_or(0)
    }

    /// Lazy ranking draws what sorting everything drew, over peaked and flat distributions, ties and
    /// every cut (sums in another order may differ in the last bits: a draw within 1e-12 of a boundary
    /// is not compared).
    #[test]
    fn lazy_ranking_draws_what_a_full_sort_drew() {
        let mut rng = Rng::new(11);
        let mut compared = 0;
        for case in 0..400 {
            let n = [5, 64, 300, 5000][case % 4];
            let spread = [0.1, 1.0, 4.0, 12.0][(case / 4) % 4];
            let logits: Vec<f32> = (0..n)
                .map(|_| {
                    let v = (rng.next_f64() * 2.0 - 1.0) * spread;
                    // Some exact ties.
                    if case % 3 == 0 {
                        (v * 4.0).round() / 4.0
                    } else {
                        v
                    }
                })
                .map(|v| v as f32)
                .collect();
            let p = SamplingParams {
                temperature: [0.3, 0.7, 1.0, 1.6][case % 4],
                top_k: [0, 1, 40, 0, 7][case % 5],
                top_p: [1.0, 0.9, 0.5, 0.95, 1.0, 0.99][case % 6],
                min_p: [0.0, 0.05, 0.0, 0.3][(case / 2) % 4],
                ..params()
            };
            for _ in 0..10 {
                let r = rng.next_f64();
                let (a, b) = (draw(&logits, &p, r), reference_draw(&logits, &p, r));
                if a != b {
                    // Only a boundary within rounding may differ.
                    let near = [r - 1e-12, r + 1e-12]
                        .iter()
                        .any(|&q| reference_draw(&logits, &p, q) == a);
                    assert!(near, "case {case}: lazy {a} vs full {b} at r {r} ({p:?})");
                } else {
                    compared += 1;
                }
            }
        }
        assert!(compared > 3900, "{compared}");
    }
}
