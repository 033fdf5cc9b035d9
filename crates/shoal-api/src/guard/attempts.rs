//! [`FailedAttempts`]: a per-address limit on failed tries of an unauthenticated route (enrolling with
//! an invite), so a stranger cannot guess invites at line rate.
//!
//! Each client address may have `max` tries that did not succeed within a `window` (a fixed window from
//! its first such try); the next is refused with the time left until the window passes (429 with
//! `Retry-After`). A try counts from the moment it begins — [`FailedAttempts::begin`] — and is taken
//! back only when it succeeds ([`Attempt::succeeded`]), so a burst of concurrent guesses is limited
//! as surely as a sequence of them. Addresses are kept whole for IPv4 and by their /64 for IPv6 (one
//! machine commonly holds a whole /64). The table holds at most `capacity` addresses: when it is full,
//! windows that have passed are dropped, and if none has, a new address shares one overflow entry with
//! every other new address until room frees up — a flood of addresses cannot grow memory, only make
//! newcomers wait.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Who a try is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    V4(u32),
    /// The /64 an IPv6 address is in.
    V6(u64),
    /// No peer address known (a request handed to the router without a socket).
    Unknown,
    /// Every new address while the table is full.
    Overflow,
}

impl Source {
    fn of(ip: Option<IpAddr>) -> Self {
        match ip.map(|ip| ip.to_canonical()) {
            Some(IpAddr::V4(v4)) => Source::V4(v4.to_bits()),
            Some(IpAddr::V6(v6)) => Source::V6((v6.to_bits() >> 64) as u64),
            None => Source::Unknown,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    tries: u32,
}

/// Tries that did not succeed, per client address; see the module docs.
#[derive(Debug)]
pub struct FailedAttempts {
    max: u32,
    window: Duration,
    capacity: usize,
    table: Mutex<HashMap<Source, Window>>,
}

impl Default for FailedAttempts {
    /// 5 failed tries a minute per address, 4,096 addresses.
    fn default() -> Self {
        FailedAttempts::new(5, Duration::from_secs(60), 4096)
    }
}

/// A try in progress: counted as failed unless [`Attempt::succeeded`] is called.
#[must_use = "a try that is dropped counts as failed"]
pub struct Attempt {
    limiter: Arc<FailedAttempts>,
    source: Source,
    started: Instant,
}

impl Attempt {
    /// The try succeeded: it no longer counts against its address.
    pub fn succeeded(self) {
        let mut table = self.limiter.lock();
        if let Some(w) = table.get_mut(&self.source)
            && w.started == self.started
        {
            w.tries = w.tries.saturating_sub(1);
        }
    }
}

impl FailedAttempts {
    /// `max` tries per `window` for each address, at most `capacity` addresses held.
    pub fn new(max: u32, window: Duration, capacity: usize) -> Self {
        FailedAttempts {
            max: max.max(1),
            window,
            capacity: capacity.max(1),
            table: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Source, Window>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a try from `ip` at `now`: the [`Attempt`], or how long until this address may try again.
    pub fn begin(self: &Arc<Self>, ip: Option<IpAddr>, now: Instant) -> Result<Attempt, Duration> {
        let mut table = self.lock();
        let mut source = Source::of(ip);
        if !table.contains_key(&source) && table.len() >= self.capacity {
            table.retain(|_, w| now < w.started + self.window);
            if table.len() >= self.capacity {
                source = Source::Overflow;
            }
        }
        let w = table.entry(source).or_insert(Window {
            started: now,
            tries: 0,
        });
        if now >= w.started + self.window {
            *w = Window {
                started: now,
                tries: 0,
            };
        }
        if w.tries >= self.max {
            return Err(w.started + self.window - now);
        }
        w.tries += 1;
        Ok(Attempt {
            limiter: self.clone(),
            source,
            started: w.started,
        })
    }

    /// Addresses held now (at most `capacity` + the overflow entry).
    pub fn held(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().expect("an address"))
    }

    #[test]
    fn after_max_failures_an_address_waits_for_its_window() {
        let limit = Arc::new(FailedAttempts::new(5, Duration::from_secs(60), 16));
        let t0 = Instant::now();
        for _ in 0..5 {
            drop(limit.begin(ip("10.0.0.1"), t0).expect("within the limit"));
        }
        let wait = limit
            .begin(ip("10.0.0.1"), t0 + Duration::from_secs(20))
            .err()
            .expect("refused");
        assert_eq!(wait, Duration::from_secs(40));
        assert!(limit.begin(ip("10.0.0.2"), t0).is_ok(), "others are not");
        assert!(
            limit
                .begin(ip("10.0.0.1"), t0 + Duration::from_secs(60))
                .is_ok()
        );
    }

    #[test]
    fn tries_in_flight_count_and_successes_are_taken_back() {
        let limit = Arc::new(FailedAttempts::new(3, Duration::from_secs(60), 16));
        let t0 = Instant::now();
        // Concurrent guesses: every try counts from its start, before any has failed.
        let held: Vec<Attempt> = (0..3)
            .map(|_| limit.begin(ip("10.0.0.1"), t0).expect("first three"))
            .collect();
        assert!(limit.begin(ip("10.0.0.1"), t0).is_err(), "the fourth waits");
        let mut held = held.into_iter();
        held.next().expect("one").succeeded();
        assert!(
            limit.begin(ip("10.0.0.1"), t0).is_ok(),
            "a success frees a try"
        );
    }

    #[test]
    fn ipv6_counts_by_64_and_mapped_ipv4_as_ipv4() {
        let limit = Arc::new(FailedAttempts::new(1, Duration::from_secs(60), 16));
        let t0 = Instant::now();
        drop(limit.begin(ip("2001:db8:1:2::1"), t0).expect("first"));
        assert!(
            limit.begin(ip("2001:db8:1:2::ffff"), t0).is_err(),
            "same /64"
        );
        assert!(
            limit.begin(ip("2001:db8:1:3::1"), t0).is_ok(),
            "another /64"
        );
        drop(limit.begin(ip("192.0.2.7"), t0).expect("first"));
        assert!(limit.begin(ip("::ffff:192.0.2.7"), t0).is_err());
    }

    #[test]
    fn a_flood_of_addresses_never_grows_the_table_past_its_capacity() {
        let limit = Arc::new(FailedAttempts::new(2, Duration::from_secs(60), 8));
        let t0 = Instant::now();
        let refused = (0..1000u32)
            .filter(|i| {
                let a = IpAddr::V4(std::net::Ipv4Addr::from_bits(0x0a00_0000 + i));
                limit.begin(Some(a), t0).is_err()
            })
            .count();
        assert!(limit.held() <= 9, "{}", limit.held());
        // 8 addresses got their own entry, two more shared the overflow entry, the rest waited.
        assert_eq!(refused, 1000 - 8 - 2);
        // Once the windows pass, new addresses get entries of their own again.
        let later = t0 + Duration::from_secs(61);
        assert!(limit.begin(ip("10.9.9.9"), later).is_ok());
        assert!(limit.held() <= 9);
    }
}
