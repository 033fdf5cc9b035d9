//! Number formatting shared by the explanations: bytes, durations, bandwidths, token rates.

/// Formats bytes in decimal units with one decimal ("9.1 GB", "24 GB").
pub fn fmt_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    let (v, unit) = if b >= 1e9 {
        (b / 1e9, "GB")
    } else if b >= 1e6 {
        (b / 1e6, "MB")
    } else if b >= 1e3 {
        (b / 1e3, "KB")
    } else {
        return format!("{bytes} B");
    };
    let s = format!("{v:.1}");
    format!("{} {unit}", s.strip_suffix(".0").unwrap_or(&s))
}

/// Formats microseconds: "48 µs" below a millisecond, "21.4 ms" above.
pub fn fmt_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1000.0)
    }
}

pub(crate) fn fmt_bandwidth(bps: f64) -> String {
    format!("{}/s", fmt_bytes(bps as u64))
}

/// Formats a rate in tokens per second: one decimal below 100, whole numbers above.
pub fn fmt_tok_s(tok_s: f64) -> String {
    if tok_s < 100.0 {
        format!("{tok_s:.1} tok/s")
    } else {
        format!("{tok_s:.0} tok/s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_readable() {
        assert_eq!(fmt_bytes(24_000_000_000), "24 GB");
        assert_eq!(fmt_bytes(9_123_000_000), "9.1 GB");
        assert_eq!(fmt_bytes(98_362_432), "98.4 MB");
        assert_eq!(fmt_bytes(1_500), "1.5 KB");
        assert_eq!(fmt_bytes(12), "12 B");
    }

    #[test]
    fn durations_are_readable() {
        assert_eq!(fmt_us(48.2), "48 µs");
        assert_eq!(fmt_us(21_400.0), "21.4 ms");
        assert_eq!(fmt_us(3_000_000.0), "3000.0 ms");
    }

    #[test]
    fn bandwidth_reads_as_bytes_per_second_once() {
        assert_eq!(fmt_bandwidth(2.5e9), "2.5 GB/s");
        assert_eq!(fmt_bandwidth(120e6), "120 MB/s");
    }

    #[test]
    fn rates_are_readable() {
        assert_eq!(fmt_tok_s(41.26), "41.3 tok/s");
        assert_eq!(fmt_tok_s(1234.4), "1234 tok/s");
    }
}
