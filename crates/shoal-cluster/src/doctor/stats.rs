//! What a series of pings says: round-trip percentiles, loss, and the peer's clock offset (NTP's rule on
//! the ping with the shortest round trip: `offset = peer_time − (t_send + rtt / 2)`). Plain numbers,
//! tested without a network.

use std::time::Duration;

/// One ping: when it was sent by this node's wall clock (nanoseconds since the Unix epoch), and, when
/// answered in time, its round trip and the peer's wall clock in the answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ping {
    pub sent_unix_ns: i128,
    pub answer: Option<Answer>,
}

/// A ping's answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answer {
    pub rtt: Duration,
    pub peer_unix_ns: i128,
}

/// The summary of a series of pings.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PingSummary {
    pub sent: usize,
    pub answered: usize,
    /// Share of pings not answered in time, in [0, 1] (0 when none was sent).
    pub loss: f64,
    pub rtt_p50: Option<Duration>,
    pub rtt_p99: Option<Duration>,
    pub rtt_min: Option<Duration>,
    /// How far the peer's clock is ahead of this node's (negative: behind), in milliseconds.
    pub clock_offset_ms: Option<f64>,
}

/// The `q`-quantile (0..=1) of sorted values, nearest rank (`p99` of 50 values is the largest).
pub fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Summarizes `pings`.
pub fn summarize(pings: &[Ping]) -> PingSummary {
    let mut rtts: Vec<Duration> = pings
        .iter()
        .filter_map(|p| p.answer.map(|a| a.rtt))
        .collect();
    rtts.sort_unstable();
    let offset = pings
        .iter()
        .filter_map(|p| Some((p.sent_unix_ns, p.answer?)))
        .min_by_key(|(_, a)| a.rtt)
        .map(|(sent, a)| {
            let midway = sent + (a.rtt.as_nanos() / 2) as i128;
            (a.peer_unix_ns - midway) as f64 / 1e6
        });
    let sent = pings.len();
    PingSummary {
        sent,
        answered: rtts.len(),
        loss: if sent == 0 {
            0.0
        } else {
            (sent - rtts.len()) as f64 / sent as f64
        },
        rtt_p50: quantile(&rtts, 0.5),
        rtt_p99: quantile(&rtts, 0.99),
        rtt_min: rtts.first().copied(),
        clock_offset_ms: offset,
    }
}

/// Bits per second of `bytes` carried in `span` (`None` for an empty or instant transfer).
pub fn bits_per_second(bytes: u64, span: Duration) -> Option<f64> {
    let secs = span.as_secs_f64();
    (bytes > 0 && secs > 0.0).then(|| bytes as f64 * 8.0 / secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(quantile(&v, 0.5), Some(ms(50)));
        assert_eq!(quantile(&v, 0.99), Some(ms(99)));
        assert_eq!(quantile(&v[..50], 0.99), Some(ms(50)));
        assert_eq!(quantile(&[ms(7)], 0.5), Some(ms(7)));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn loss_counts_unanswered_pings_and_the_offset_uses_the_fastest_ping() {
        // The peer's clock is 250 ms ahead. The fast ping (2 ms) says so exactly; the slow one (40 ms,
        // queued one way only) would be off by 19 ms.
        let ahead = 250_000_000i128;
        let pings = [
            Ping {
                sent_unix_ns: 1_000_000_000,
                answer: Some(Answer {
                    rtt: ms(40),
                    peer_unix_ns: 1_000_000_000 + 1_000_000 + ahead,
                }),
            },
            Ping {
                sent_unix_ns: 2_000_000_000,
                answer: Some(Answer {
                    rtt: ms(2),
                    peer_unix_ns: 2_000_000_000 + 1_000_000 + ahead,
                }),
            },
            Ping {
                sent_unix_ns: 3_000_000_000,
                answer: None,
            },
            Ping {
                sent_unix_ns: 4_000_000_000,
                answer: None,
            },
        ];
        let s = summarize(&pings);
        assert_eq!((s.sent, s.answered), (4, 2));
        assert_eq!(s.loss, 0.5);
        assert_eq!(s.rtt_min, Some(ms(2)));
        assert_eq!(s.rtt_p99, Some(ms(40)));
        assert_eq!(s.clock_offset_ms, Some(250.0));
        let none = summarize(&pings[2..]);
        assert_eq!(
            (none.loss, none.rtt_p50, none.clock_offset_ms),
            (1.0, None, None)
        );
        assert_eq!(summarize(&[]).loss, 0.0);
    }

    #[test]
    fn bandwidth_is_in_bits_per_second() {
        assert_eq!(
            bits_per_second(5_000_000, Duration::from_secs(1)),
            Some(40e6)
        );
        assert_eq!(bits_per_second(0, Duration::from_secs(1)), None);
        assert_eq!(bits_per_second(10, Duration::ZERO), None);
    }
}
