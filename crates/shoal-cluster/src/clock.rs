//! Wall-clock time as unix seconds (node start times, invite expiry, removal times).

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the unix epoch (0 on a clock set before 1970).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
