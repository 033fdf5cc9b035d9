//! [`KvPool`]: the node's KV-cache memory, shared by every engine (model instance) on it.
//!
//! Each engine reserves bytes before its sequences grow and gives them back when they shrink, so several
//! models loaded at once share one budget: memory one model frees is there for the next, and no engine's
//! limit depends on which model loaded last. Reservations are atomic, so the sum never exceeds the budget.
//!
//! Cached prefixes are the only memory an engine holds that it does not need: an engine that cannot grow
//! even after evicting its own asks the pool ([`KvPool::request`]), and every engine holding cached
//! prefixes evicts its least recently used ones until the request is met ([`KvPool::wanted`]); running
//! sequences are never taken from another engine.
//!
//! The pool also keeps the buffers of freed KV caches for the next ones ([`KvBuffers`]): memory already
//! faulted in, so a new sequence does not page-fault its KV in again. Kept buffers live in the budget's
//! unreserved part — reserved plus kept never exceeds the budget: a buffer given back when there is no
//! room is freed, and a reservation that needs the room frees kept buffers (the longest first) — so the
//! budget stays a true bound on the node's KV memory.
//!
//! The pool publishes its budget, what is reserved and what is kept as the gauges
//! `shoal_kv_pool_capacity_bytes`, `shoal_kv_pool_used_bytes` and `shoal_kv_pool_idle_bytes` (one node,
//! one pool) on every change.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use shoal_model::KvBuffers;
use shoal_model::kv::{KvBuf, KvSpares, buf_bytes};

use crate::meters::PoolGauges;

#[derive(Debug)]
pub struct KvPool {
    budget: usize,
    reserved: AtomicUsize,
    /// Bytes an engine is waiting for (0 when none); lowered by every release.
    wanted: AtomicUsize,
    /// Buffers of freed KV caches, kept for the next ones.
    spares: Mutex<KvSpares>,
    /// Bytes in `spares` (read without the lock by every reservation).
    idle: AtomicUsize,
    gauges: PoolGauges,
}

impl KvPool {
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            budget: budget_bytes,
            reserved: AtomicUsize::new(0),
            wanted: AtomicUsize::new(0),
            spares: Mutex::new(KvSpares::default()),
            idle: AtomicUsize::new(0),
            gauges: PoolGauges::new(budget_bytes),
        }
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes reserved by all engines together.
    pub fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }

    /// Reserves `bytes` if they fit; false (and nothing reserved) otherwise.
    pub fn try_reserve(&self, bytes: usize) -> bool {
        let ok = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                r.checked_add(bytes).filter(|&t| t <= self.budget)
            })
            .is_ok();
        if ok {
            self.gauges.used(self.reserved());
            self.shed();
        }
        ok
    }

    /// Reserves as much of `bytes` as is free (possibly 0); returns what was reserved.
    pub fn reserve_up_to(&self, bytes: usize) -> usize {
        let mut granted = 0;
        let _ = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                granted = bytes.min(self.budget.saturating_sub(r));
                Some(r + granted)
            });
        self.gauges.used(self.reserved());
        self.shed();
        granted
    }

    /// Gives back `bytes` reserved earlier (which also counts towards a pending request).
    pub fn release(&self, bytes: usize) {
        for counter in [&self.reserved, &self.wanted] {
            let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(bytes))
            });
        }
        self.gauges.used(self.reserved());
    }

    /// Asks the engines holding cached prefixes to free `bytes` (the largest pending request wins; an
    /// engine still short after its next try asks again).
    pub fn request(&self, bytes: usize) {
        self.wanted.fetch_max(bytes, Ordering::AcqRel);
    }

    /// Withdraws the pending request (its engine got the memory; another still waiting asks again).
    pub fn clear_request(&self) {
        self.wanted.store(0, Ordering::Release);
    }

    /// Bytes some engine is waiting for (0 when none).
    pub fn wanted(&self) -> usize {
        self.wanted.load(Ordering::Acquire)
    }

    /// Bytes of freed KV buffers kept for reuse (never more than the unreserved budget).
    pub fn idle(&self) -> usize {
        self.idle.load(Ordering::Acquire)
    }

    fn spares(&self) -> MutexGuard<'_, KvSpares> {
        // Nothing panics while holding the lock; a poisoned one still holds consistent buffers.
        self.spares.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes what `spares` holds (called with its lock held).
    fn kept(&self, spares: &KvSpares) {
        self.idle.store(spares.bytes(), Ordering::Release);
        self.gauges.idle(spares.bytes());
    }

    /// Frees kept buffers, the longest first, while they and the reservations exceed the budget.
    fn shed(&self) {
        if self.reserved() + self.idle() <= self.budget {
            return;
        }
        let mut freed = Vec::new();
        {
            let mut spares = self.spares();
            while self.reserved() + spares.bytes() > self.budget {
                let Some(buf) = spares.pop_largest() else {
                    break;
                };
                freed.push(buf);
            }
            self.kept(&spares);
        }
        drop(freed); // outside the lock
    }
}

impl KvBuffers for KvPool {
    fn take(&self, len: usize) -> Option<KvBuf> {
        if self.idle() == 0 {
            return None;
        }
        let mut spares = self.spares();
        let buf = spares.take(len);
        self.kept(&spares);
        buf
    }

    fn give(&self, buf: KvBuf) {
        let bytes = buf_bytes(&buf);
        let mut spares = self.spares();
        if self.reserved() + spares.bytes() + bytes <= self.budget {
            spares.put(buf);
            self.kept(&spares);
        } else {
            drop(spares);
            drop(buf); // no room: freed (outside the lock)
        }
    }
}

/// KV memory held for a pipeline stage this node hosts for another node's engine, from the moment the
/// stage loads until it goes (dropped): that engine cannot ask this node's pool as it grows, so the
/// stage's share is set aside up front and the engine is told how many tokens it holds.
#[derive(Debug)]
pub struct KvShare {
    pool: Arc<KvPool>,
    bytes: usize,
    tokens: usize,
}

/// Not even one token of a stage's KV fits in what is left of the node's budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no KV memory left on this node: {reserved} of {budget} bytes reserved")]
pub struct NoKvMemory {
    pub reserved: usize,
    pub budget: usize,
}

impl KvShare {
    /// Reserves room for as many tokens as the whole budget of `pool` holds for the whole model
    /// (`model_token_bytes` per token), or for as many as the unreserved rest holds if fewer;
    /// `stage_token_bytes` is what a token takes in the stage's layers. An error if not even one token
    /// fits.
    pub fn reserve(
        pool: &Arc<KvPool>,
        stage_token_bytes: usize,
        model_token_bytes: usize,
    ) -> Result<Self, NoKvMemory> {
        let stage = stage_token_bytes.max(1);
        let want = pool.budget() / model_token_bytes.max(1);
        let granted = pool.reserve_up_to(want.saturating_mul(stage));
        let tokens = granted / stage;
        pool.release(granted - tokens * stage);
        let share = Self {
            pool: pool.clone(),
            bytes: tokens * stage,
            tokens,
        };
        if tokens == 0 {
            return Err(NoKvMemory {
                reserved: pool.reserved(),
                budget: pool.budget(),
            });
        }
        Ok(share)
    }

    /// Tokens of KV the share holds room for.
    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

impl Drop for KvShare {
    fn drop(&mut self) {
        self.pool.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosted_stage_share_holds_what_the_budget_holds_for_the_whole_model_and_returns_it() {
        let pool = Arc::new(KvPool::new(1000));
        // A stage of a quarter of the layers: 10 bytes a token, 40 for the whole model.
        let share = KvShare::reserve(&pool, 10, 40).expect("room");
        assert_eq!((share.tokens(), pool.reserved()), (25, 250));
        // What is left goes to the next one, then nothing.
        assert!(pool.try_reserve(700));
        let small = KvShare::reserve(&pool, 10, 40).expect("room");
        assert_eq!((small.tokens(), pool.reserved()), (5, 1000));
        let err = KvShare::reserve(&pool, 10, 40).expect_err("full");
        assert!(err.to_string().contains("no KV memory left"), "{err}");
        assert_eq!(pool.reserved(), 1000);
        drop(share);
        drop(small);
        assert_eq!(pool.reserved(), 700);
    }

    #[test]
    fn a_request_for_memory_is_lowered_by_releases_and_withdrawn() {
        let pool = KvPool::new(100);
        assert_eq!(pool.wanted(), 0);
        pool.request(30);
        pool.request(10); // the largest pending request wins
        assert_eq!(pool.wanted(), 30);
        assert!(pool.try_reserve(50));
        pool.release(20);
        assert_eq!((pool.wanted(), pool.reserved()), (10, 30));
        pool.release(20);
        assert_eq!((pool.wanted(), pool.reserved()), (0, 10));
        pool.request(5);
        pool.clear_request();
        assert_eq!(pool.wanted(), 0);
    }

    #[test]
    fn reservations_never_exceed_the_budget() {
        let pool = KvPool::new(100);
        assert!(pool.try_reserve(60));
        assert!(!pool.try_reserve(41), "would exceed");
        assert!(pool.try_reserve(40));
        assert_eq!(pool.reserved(), 100);
        pool.release(30);
        assert!(pool.try_reserve(30));
        assert!(!pool.try_reserve(1));
        pool.release(25);
        assert_eq!(pool.reserve_up_to(40), 25);
        assert_eq!(pool.reserve_up_to(40), 0);
    }

    #[test]
    fn concurrent_reservations_stay_within_the_budget() {
        let pool = std::sync::Arc::new(KvPool::new(1000));
        let granted: usize = (0..8)
            .map(|_| {
                let p = pool.clone();
                std::thread::spawn(move || (0..500).filter(|_| p.try_reserve(1)).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(granted, 1000);
        assert_eq!(pool.reserved(), 1000);
    }

    /// A buffer of `bytes` bytes of f16 values.
    fn buf(bytes: usize) -> KvBuf {
        vec![Default::default(); bytes / shoal_model::kv::VALUE_BYTES]
    }

    #[test]
    fn kept_buffers_stay_within_the_unreserved_budget_and_go_first_when_it_is_needed() {
        let pool = KvPool::new(1000);
        assert!(pool.try_reserve(400));
        pool.give(buf(300));
        pool.give(buf(200));
        assert_eq!(pool.idle(), 500);
        // No room for another: freed, not kept.
        pool.give(buf(200));
        assert_eq!(pool.idle(), 500);
        // A take gets the shortest that is long enough (within twice).
        assert_eq!(pool.take(90).map(|b| b.len()), Some(100));
        assert_eq!(pool.idle(), 300);
        pool.give(buf(200));
        // A reservation that needs the room frees kept buffers, the longest first.
        assert!(pool.try_reserve(350));
        assert_eq!((pool.reserved(), pool.idle()), (750, 200));
        assert_eq!(pool.reserve_up_to(300), 250);
        assert_eq!((pool.reserved(), pool.idle()), (1000, 0));
        assert_eq!(pool.take(1), None);
        // Released memory can be kept again.
        pool.release(600);
        pool.give(buf(600));
        assert_eq!(pool.reserved() + pool.idle(), 1000);
    }
}
