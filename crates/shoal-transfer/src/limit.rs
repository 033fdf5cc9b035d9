//! [`UploadLimit`]: paces what this node's blob server sends to peers to a byte rate shared by all its
//! streams (`shoal serve --upload-limit`), so serving a model does not fill a slow uplink.
//!
//! Pacing by reservation: each answer of `n` bytes reserves the next `n / rate` seconds of the shared
//! timeline and waits until its slot starts, so the long-run rate is the limit and at most one answer
//! per stream is ever in a burst.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A byte rate shared by every stream of one server.
#[derive(Debug)]
pub struct UploadLimit {
    bytes_per_s: f64,
    /// When the timeline is free again.
    next: Mutex<Instant>,
}

impl UploadLimit {
    /// `bytes_per_s` must be > 0 (checked by the caller's argument parsing; smaller is clamped to 1).
    pub fn new(bytes_per_s: u64) -> Self {
        Self {
            bytes_per_s: bytes_per_s.max(1) as f64,
            next: Mutex::new(Instant::now()),
        }
    }

    /// Waits until `n` more bytes may go out.
    pub async fn take(&self, n: u64) {
        let start = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let start = (*next).max(Instant::now());
            *next = start + Duration::from_secs_f64(n as f64 / self.bytes_per_s);
            start
        };
        tokio::time::sleep_until(start).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_more_than_the_limit_goes_out() {
        let limit = UploadLimit::new(10_000_000);
        let t0 = Instant::now();
        for _ in 0..10 {
            limit.take(200_000).await;
        }
        // Ten 20 ms slots: the tenth starts no sooner than 180 ms after the first (sleeps are never
        // shorter than asked; there is no upper bound to assert on a shared machine).
        let elapsed = t0.elapsed();
        assert!(elapsed >= Duration::from_millis(180), "{elapsed:?}");
    }
}
