//! Human-readable explanations of placements.

use std::fmt::Write;

use crate::cost::Hop;
use crate::search::{Candidate, Ctx};

/// How the node set of a placement was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Auto,
    Pinned,
    Manual,
}

/// What each node of the pool could do alone.
pub(crate) struct SingleNode {
    pub id: String,
    pub needed: u64,
    pub has: u64,
    /// Predicted latency when the node fits alone.
    pub latency_us: Option<f64>,
}

pub(crate) fn single_nodes(ctx: &Ctx, pool: &[usize]) -> Vec<SingleNode> {
    let needed = ctx.card.total_bytes(ctx.kv_tokens);
    pool.iter()
        .map(|&i| {
            let node = &ctx.topo.nodes[i];
            SingleNode {
                id: node.id.clone(),
                needed,
                has: node.mem_available,
                latency_us: (needed <= node.mem_available)
                    .then(|| ctx.card.n_layers as f64 / node.speed * 1e6),
            }
        })
        .collect()
}

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

fn fmt_bandwidth(bps: f64) -> String {
    format!("{}/s", fmt_bytes(bps as u64))
}

fn fmt_hop(hop: &Hop) -> String {
    let kind = hop.kind;
    let rtt = match hop.measured_rtt_us {
        Some(r) => format!("measured {} rtt", fmt_us(r)),
        None => format!("assumed {} rtt", fmt_us(kind.default_rtt_us())),
    };
    let bw = match hop.measured_bandwidth_bps {
        Some(b) => format!("measured {}", fmt_bandwidth(b)),
        None => format!("assumed {}", fmt_bandwidth(kind.default_bandwidth_bps())),
    };
    format!(
        "{}→{} over {} ({rtt}, {bw}): {}",
        hop.from,
        hop.to,
        kind.name(),
        fmt_us(hop.us)
    )
}

pub(crate) fn explain(ctx: &Ctx, cand: &Candidate, mode: Mode, singles: &[SingleNode]) -> String {
    let mut out = String::new();
    match mode {
        Mode::Auto => {}
        Mode::Pinned => out.push_str("pinned nodes; "),
        Mode::Manual => out.push_str("manual layer counts; "),
    }
    let k = cand.stages.len();
    let _ = write!(out, "{k} stage{}: ", if k == 1 { "" } else { "s" });
    for (i, (stage, &node_idx)) in cand.stages.iter().zip(&cand.order).enumerate() {
        let node = &ctx.topo.nodes[node_idx];
        let used = ctx
            .card
            .stage_bytes(stage.layers(), i == 0, i + 1 == k, ctx.kv_tokens);
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(
            out,
            "{} layers {}–{} ({} layer{}, {} of {}, {})",
            stage.node,
            stage.start,
            stage.end - 1,
            stage.layers(),
            if stage.layers() == 1 { "" } else { "s" },
            fmt_bytes(used),
            fmt_bytes(node.mem_available),
            fmt_us(cand.cost.compute_us[i]),
        );
    }
    if cand.cost.hops.is_empty() {
        out.push_str("; no network hops");
    }
    for hop in &cand.cost.hops {
        let _ = write!(out, "; hop {}", fmt_hop(hop));
    }
    if !cand.cost.return_path.is_empty() {
        let path: Vec<String> = cand.cost.return_path.iter().map(fmt_hop).collect();
        let _ = write!(out, "; token returns {}", path.join(" then "));
    }
    let compute: f64 = cand.cost.compute_us.iter().sum();
    let _ = write!(
        out,
        "; predicted {}/token (compute {}, network {})",
        fmt_us(cand.cost.total_us),
        fmt_us(compute),
        fmt_us(cand.cost.total_us - compute)
    );
    let rejected: Vec<String> = singles
        .iter()
        .filter(|s| s.latency_us.is_none())
        .map(|s| {
            format!(
                "{} (needs {}, has {})",
                s.id,
                fmt_bytes(s.needed),
                fmt_bytes(s.has)
            )
        })
        .collect();
    if !rejected.is_empty() {
        let _ = write!(
            out,
            "; single-node options rejected: {}",
            rejected.join(", ")
        );
    }
    if k > 1 {
        let slower: Vec<String> = singles
            .iter()
            .filter_map(|s| Some(format!("{} ({}/token)", s.id, fmt_us(s.latency_us?))))
            .collect();
        if !slower.is_empty() {
            let _ = write!(
                out,
                "; single-node options predicted slower: {}",
                slower.join(", ")
            );
        }
    }
    out
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
    }
}

#[cfg(test)]
mod bandwidth_tests {
    use super::*;

    #[test]
    fn bandwidth_reads_as_bytes_per_second_once() {
        assert_eq!(fmt_bandwidth(2.5e9), "2.5 GB/s");
        assert_eq!(fmt_bandwidth(120e6), "120 MB/s");
    }
}
