//! Prefix cache index: which token sequences have their KV kept by the stages, LRU under a token budget.
//!
//! Pure bookkeeping, no tensors: the engine asks [`PrefixIndex::lookup`] for the longest cached prefix of
//! a new prompt and tells every stage to start the sequence from it; when a sequence finishes it offers
//! its computed tokens to [`PrefixIndex::insert`], which says whether to keep them and which entries to
//! evict. The KV of a token depends only on the tokens before it, so a reused prefix gives exactly the
//! output a full prefill gives.

/// Prefixes shorter than this are not worth an entry.
pub const MIN_PREFIX_TOKENS: usize = 4;

#[derive(Debug, Clone)]
struct Entry {
    id: u64,
    tokens: Vec<u32>,
    last_used: u64,
}

#[derive(Debug)]
pub struct PrefixIndex {
    entries: Vec<Entry>,
    budget_tokens: usize,
    used_tokens: usize,
    clock: u64,
    next_id: u64,
}

/// What to do with a finished sequence's KV.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Insert {
    /// Keep it under this entry id.
    pub store: Option<u64>,
    /// Entries whose KV the stages must drop.
    pub evict: Vec<u64>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixIndex {
    /// `budget_tokens` = 0 disables the cache.
    pub fn new(budget_tokens: usize) -> Self {
        Self {
            entries: Vec::new(),
            budget_tokens,
            used_tokens: 0,
            clock: 0,
            next_id: 1,
        }
    }

    pub fn used_tokens(&self) -> usize {
        self.used_tokens
    }

    /// The entry sharing the longest prefix with `prompt`, and how many tokens to reuse: at most
    /// `prompt.len() - 1`, since the last prompt token must run to give the first logits.
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(u64, usize)> {
        let max = prompt.len().saturating_sub(1);
        let (i, n) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt).min(max)))
            .max_by_key(|&(_, n)| n)?;
        if n < MIN_PREFIX_TOKENS {
            return None;
        }
        self.clock += 1;
        self.entries[i].last_used = self.clock;
        Some((self.entries[i].id, n))
    }

    /// Evicts the least recently used entry (to free KV memory for running sequences): its id.
    pub fn pop_lru(&mut self) -> Option<u64> {
        let i = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.last_used)
            .map(|(i, _)| i)?;
        let e = self.entries.swap_remove(i);
        self.used_tokens -= e.tokens.len();
        Some(e.id)
    }

    /// Offers the computed tokens of a finished sequence.
    pub fn insert(&mut self, tokens: &[u32]) -> Insert {
        let mut out = Insert::default();
        if tokens.len() < MIN_PREFIX_TOKENS || tokens.len() > self.budget_tokens {
            return out;
        }
        self.clock += 1;
        // Already covered by a longer (or equal) entry: just refresh it.
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.tokens.starts_with(tokens))
        {
            e.last_used = self.clock;
            return out;
        }
        // Entries that are prefixes of the new one are superseded by it.
        let mut kept = Vec::with_capacity(self.entries.len());
        for e in self.entries.drain(..) {
            if tokens.starts_with(&e.tokens) {
                self.used_tokens -= e.tokens.len();
                out.evict.push(e.id);
            } else {
                kept.push(e);
            }
        }
        self.entries = kept;
        while self.used_tokens + tokens.len() > self.budget_tokens {
            let Some(lru) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i)
            else {
                break;
            };
            let e = self.entries.swap_remove(lru);
            self.used_tokens -= e.tokens.len();
            out.evict.push(e.id);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.used_tokens += tokens.len();
        self.entries.push(Entry {
            id,
            tokens: tokens.to_vec(),
            last_used: self.clock,
        });
        out.store = Some(id);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_the_longest_shared_prefix_but_leaves_one_token_to_run() {
        let mut p = PrefixIndex::new(100);
        let a = p.insert(&[1, 2, 3, 4, 5, 6]).store.unwrap();
        let b = p.insert(&[1, 2, 9, 9, 9, 9, 9]).store.unwrap();
        assert_eq!(p.lookup(&[1, 2, 3, 4, 5, 6, 7, 8]), Some((a, 6)));
        // Identical prompt: the last token still runs.
        assert_eq!(p.lookup(&[1, 2, 3, 4, 5, 6]), Some((a, 5)));
        assert_eq!(p.lookup(&[1, 2, 9, 9, 9, 0]), Some((b, 5)));
        // Too short a match.
        assert_eq!(p.lookup(&[1, 2, 7, 7, 7]), None);
        assert_eq!(p.lookup(&[8, 8, 8, 8, 8]), None);
    }

    #[test]
    fn longer_turns_supersede_their_prefixes_and_prefixes_of_entries_are_not_stored() {
        let mut p = PrefixIndex::new(100);
        let a = p.insert(&[1, 2, 3, 4]).store.unwrap();
        let ins = p.insert(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(ins.evict, vec![a]);
        let b = ins.store.unwrap();
        assert_eq!(p.insert(&[1, 2, 3, 4, 5]), Insert::default());
        assert_eq!(p.used_tokens(), 6);
        assert_eq!(p.lookup(&[1, 2, 3, 4, 5, 6, 7]), Some((b, 6)));
    }

    #[test]
    fn least_recently_used_entries_are_evicted_to_stay_in_budget() {
        let mut p = PrefixIndex::new(12);
        let a = p.insert(&[1, 1, 1, 1, 1]).store.unwrap();
        let b = p.insert(&[2, 2, 2, 2, 2]).store.unwrap();
        p.lookup(&[1, 1, 1, 1, 1, 0]); // a is now more recent than b
        let ins = p.insert(&[3, 3, 3, 3, 3]);
        assert_eq!(ins.evict, vec![b]);
        assert!(ins.store.is_some());
        assert!(p.used_tokens() <= 12);
        assert_eq!(p.lookup(&[1, 1, 1, 1, 1, 0]).map(|x| x.0), Some(a));
        // Larger than the whole budget, or disabled: never stored.
        assert_eq!(p.insert(&[4; 13]), Insert::default());
        assert_eq!(PrefixIndex::new(0).insert(&[1, 2, 3, 4]), Insert::default());
    }
}
