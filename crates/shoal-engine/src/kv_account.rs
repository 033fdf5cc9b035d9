//! [`KvAccount`]: how much KV memory one engine holds, and may hold.
//!
//! The engine's KV is paid from two places: the node's [`KvPool`] (shared with the other engines on the
//! node) pays for the layers in this process, `token_bytes` per token; stages on other nodes set room
//! aside there and cap the tokens the engine may hold in all (`token_cap`). The account reserves
//! against both, asks the other engines for memory when the pool is short, grants each step what the
//! pool can give, and gives everything back when dropped. It decides nothing about sequences: the
//! worker says how many tokens it holds and needs, and chooses what to evict or preempt.

use std::sync::Arc;

use crate::kvpool::KvPool;

#[derive(Debug)]
pub(crate) struct KvAccount {
    /// The node's KV memory, shared with other engines.
    pool: Arc<KvPool>,
    /// KV bytes one token takes in the layers of this process (what the node's pool pays).
    token_bytes: usize,
    /// Tokens of KV the stages on other nodes can hold (`usize::MAX` when there are none).
    token_cap: usize,
    /// Tokens of KV this engine has reserved in the pool (≥ what it holds).
    reserved: usize,
    /// Whether this engine has asked the others for memory (and should withdraw the request once served).
    asked_others: bool,
}

impl KvAccount {
    /// An empty account on `pool`; `token_bytes` is clamped to at least 1.
    pub(crate) fn new(pool: Arc<KvPool>, token_bytes: usize, token_cap: usize) -> Self {
        Self {
            pool,
            token_bytes: token_bytes.max(1),
            token_cap,
            reserved: 0,
            asked_others: false,
        }
    }

    /// Tokens of KV reserved now.
    #[cfg(test)]
    pub(crate) fn reserved(&self) -> usize {
        self.reserved
    }

    /// Tokens of KV the whole node budget holds, or the remote stages can hold if fewer (the most this
    /// engine could ever get).
    pub(crate) fn max_tokens(&self) -> usize {
        (self.pool.budget() / self.token_bytes)
            .min(self.token_cap)
            .max(1)
    }

    /// Grows the reservation to `tokens` if the pool and the remote stages have room; true when it holds
    /// that much.
    pub(crate) fn reserve(&mut self, tokens: usize) -> bool {
        if tokens <= self.reserved {
            return true;
        }
        if tokens > self.token_cap {
            return false;
        }
        if self
            .pool
            .try_reserve((tokens - self.reserved) * self.token_bytes)
        {
            self.reserved = tokens;
            true
        } else {
            false
        }
    }

    /// [`KvAccount::reserve`], and once it succeeds the request this engine made to the others (if any)
    /// is withdrawn: it got its memory.
    pub(crate) fn hold(&mut self, tokens: usize) -> bool {
        if !self.reserve(tokens) {
            return false;
        }
        if std::mem::take(&mut self.asked_others) {
            self.pool.clear_request();
        }
        true
    }

    /// Asks the other engines on the node to free what holding `tokens` lacks beyond the pool's free
    /// memory. Nothing is asked when the remote stages' cap is what is short (other engines here cannot
    /// help).
    pub(crate) fn ask_others(&mut self, tokens: usize) {
        if tokens > self.token_cap {
            return;
        }
        self.asked_others = true;
        let short = tokens.saturating_sub(self.reserved);
        let free = self.pool.budget().saturating_sub(self.pool.reserved());
        self.pool
            .request((short * self.token_bytes).saturating_sub(free));
    }

    /// Tokens of KV another engine on the node waits for (rounded up; 0 when none): what this engine
    /// should free from its cached prefixes.
    pub(crate) fn wanted_by_others(&self) -> usize {
        self.pool.wanted().div_ceil(self.token_bytes)
    }

    /// Gives back the reservation beyond the `held` tokens.
    pub(crate) fn trim(&mut self, held: usize) {
        if self.reserved > held {
            self.pool.release((self.reserved - held) * self.token_bytes);
            self.reserved = held;
        }
    }

    /// The grant of one step: takes what the pool can give, up to room for `batch_tokens` more than the
    /// `held` tokens (never past the remote cap), in whole tokens (the remainder goes straight back);
    /// returns the tokens free to compute this step. The unused part is given back by
    /// [`KvAccount::trim`] after the step.
    pub(crate) fn grant_step(&mut self, held: usize, batch_tokens: usize) -> usize {
        let want = batch_tokens * self.token_bytes;
        let extra = (held + batch_tokens)
            .min(self.token_cap)
            .saturating_sub(self.reserved);
        let granted = self
            .pool
            .reserve_up_to((extra * self.token_bytes).min(want));
        self.reserved += granted / self.token_bytes;
        self.pool.release(granted % self.token_bytes);
        self.reserved.saturating_sub(held)
    }
}

impl Drop for KvAccount {
    fn drop(&mut self) {
        // The engine is gone: its KV memory is the other engines' now.
        self.pool.release(self.reserved * self.token_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `tokens` tokens at `token_bytes` each, and an account on it.
    fn account(tokens: usize, token_bytes: usize, cap: usize) -> (Arc<KvPool>, KvAccount) {
        let pool = Arc::new(KvPool::new(tokens * token_bytes));
        let account = KvAccount::new(pool.clone(), token_bytes, cap);
        (pool, account)
    }

    #[test]
    fn reserves_within_the_pool_and_refuses_beyond_it() {
        let (pool, mut kv) = account(10, 4, usize::MAX);
        assert_eq!(kv.max_tokens(), 10);
        assert!(kv.reserve(6));
        assert_eq!((kv.reserved(), pool.reserved()), (6, 24));
        assert!(kv.reserve(3), "already held");
        assert_eq!(
            kv.reserved(),
            6,
            "a smaller ask never shrinks the reservation"
        );
        assert!(!kv.reserve(11));
        assert_eq!(
            (kv.reserved(), pool.reserved()),
            (6, 24),
            "a refusal takes nothing"
        );
        assert!(kv.reserve(10));
        assert_eq!(pool.reserved(), 40);
    }

    #[test]
    fn the_remote_stages_cap_bounds_what_it_may_hold() {
        let (pool, mut kv) = account(100, 2, 8);
        assert_eq!(kv.max_tokens(), 8);
        assert!(
            !kv.reserve(9),
            "the pool has room but the remote stages do not"
        );
        assert_eq!(pool.reserved(), 0);
        assert!(kv.reserve(8));
        // Nothing to ask the other engines for: they cannot lend remote memory.
        kv.ask_others(9);
        assert_eq!(pool.wanted(), 0);
    }

    #[test]
    fn trimming_gives_back_what_is_not_held() {
        let (pool, mut kv) = account(10, 4, usize::MAX);
        assert!(kv.reserve(8));
        kv.trim(9);
        assert_eq!(kv.reserved(), 8, "trimming never grows");
        kv.trim(3);
        assert_eq!((kv.reserved(), pool.reserved()), (3, 12));
    }

    #[test]
    fn asking_others_sets_the_pools_request_until_served() {
        let (pool, mut kv) = account(10, 4, usize::MAX);
        // Another engine holds 8 of the 10 tokens.
        assert!(pool.try_reserve(32));
        assert!(kv.reserve(1));
        assert!(!kv.hold(5));
        kv.ask_others(5);
        // 4 tokens short, 1 token free in the pool: 3 tokens' bytes wanted.
        assert_eq!(pool.wanted(), 12);
        let other = KvAccount::new(pool.clone(), 4, usize::MAX);
        assert_eq!(other.wanted_by_others(), 3);
        // A third engine asks for more (the largest request stands); the second frees 4 tokens, which
        // lowers the request; once this engine holds what it asked for it withdraws the request.
        pool.request(40);
        pool.release(16);
        assert_eq!(pool.wanted(), 24);
        assert!(kv.hold(5));
        assert_eq!(pool.wanted(), 0);
        pool.request(8);
        assert!(kv.hold(5), "already held");
        assert_eq!(
            pool.wanted(),
            8,
            "withdrawn once only: this is someone else's request"
        );
    }

    #[test]
    fn wanted_memory_rounds_up_to_whole_tokens() {
        let (pool, kv) = account(10, 4, usize::MAX);
        pool.request(5);
        assert_eq!(kv.wanted_by_others(), 2);
    }

    #[test]
    fn the_step_grant_takes_whole_tokens_and_returns_the_remainder() {
        // 10 tokens of 4 bytes, plus 3 stray bytes of budget.
        let pool = Arc::new(KvPool::new(43));
        let mut kv = KvAccount::new(pool.clone(), 4, usize::MAX);
        assert!(kv.reserve(2));
        // Holding 2, a batch of up to 16 more: the pool has 8 whole tokens (and 3 bytes) left.
        assert_eq!(kv.grant_step(2, 16), 8);
        assert_eq!((kv.reserved(), pool.reserved()), (10, 40));
        kv.trim(5);
        assert_eq!(pool.reserved(), 20);
        // The grant never goes past the batch or the remote cap.
        let (pool, mut capped) = account(100, 1, 6);
        assert_eq!(capped.grant_step(0, 4), 4);
        assert_eq!(capped.grant_step(4, 4), 2);
        assert_eq!(pool.reserved(), 6);
    }

    #[test]
    fn dropping_the_account_releases_everything() {
        let (pool, mut kv) = account(10, 4, usize::MAX);
        assert!(kv.reserve(7));
        assert_eq!(kv.grant_step(7, 2), 2);
        drop(kv);
        assert_eq!(pool.reserved(), 0);
    }
}
