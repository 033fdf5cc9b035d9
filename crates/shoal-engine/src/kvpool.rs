//! [`KvPool`]: the node's KV-cache memory, shared by every engine (model instance) on it.
//!
//! Each engine reserves bytes before its sequences grow and gives them back when they shrink, so several
//! models loaded at once share one budget: memory one model frees is there for the next, and no engine's
//! limit depends on which model loaded last. Reservations are atomic, so the sum never exceeds the budget.

use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub struct KvPool {
    budget: usize,
    reserved: AtomicUsize,
}

impl KvPool {
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            budget: budget_bytes,
            reserved: AtomicUsize::new(0),
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
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                r.checked_add(bytes).filter(|&t| t <= self.budget)
            })
            .is_ok()
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
        granted
    }

    /// Gives back `bytes` reserved earlier.
    pub fn release(&self, bytes: usize) {
        let _ = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(bytes))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
