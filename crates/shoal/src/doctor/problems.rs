//! What is wrong, from a doctor's measurements: each [`Problem`] is one sentence with a one-line hint,
//! an [`Severity::Error`] (something does not work: the exit status is 1) or a [`Severity::Warning`]
//! (it works, slower or at risk: the exit status stays 0). Pure rules over the report's data, tested
//! without a network.

use serde::Serialize;
use shoal_cluster::doctor::PeerReport;

use super::local::{Checksum, LocalReport};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One thing wrong, and what to do about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    pub severity: Severity,
    pub what: String,
    pub hint: String,
}

fn problem(severity: Severity, what: String, hint: &str) -> Problem {
    Problem {
        severity,
        what,
        hint: hint.to_string(),
    }
}

/// An error when `severe`, else a warning.
fn error_if(severe: bool) -> Severity {
    if severe {
        Severity::Error
    } else {
        Severity::Warning
    }
}

/// Why the running node's part is missing.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeFailure {
    /// Nothing answers at the URL.
    NoNode { url: String },
    /// The node refused the API key (or its absence).
    Refused { url: String },
    /// The node answered with an error.
    Failed { url: String, message: String },
}

/// Below this, a link is slow for pipeline hops and model transfers (bits per second).
pub const SLOW_LINK_BPS: f64 = 20e6;
/// Round trips above this (p99) make every token of a pipeline across the link slower.
pub const SLOW_RTT_MS: f64 = 50.0;
/// Pings lost above this share make a link unusable, not just unsteady.
pub const LOSSY: f64 = 0.2;
/// Clock offsets above these: noticed (logs and timings disagree), then broken (invites expire early
/// or late).
pub const SKEW_WARN_MS: f64 = 1_000.0;
pub const SKEW_ERROR_MS: f64 = 300_000.0;

/// Every problem of the report, errors first.
pub fn find(
    local: &LocalReport,
    peers: Option<&[PeerReport]>,
    node: Option<&NodeFailure>,
) -> Vec<Problem> {
    let mut out = Vec::new();
    if let Some(f) = node {
        out.push(match f {
            NodeFailure::NoNode { url } => problem(
                Severity::Error,
                format!("no shoal node answers at {url}"),
                "start one with `shoal serve` (or point --url at a running node)",
            ),
            NodeFailure::Refused { url } => problem(
                Severity::Error,
                format!("the node at {url} refused the API key"),
                "pass the node's key with --api-key or SHOAL_API_KEY",
            ),
            NodeFailure::Failed { url, message } => problem(
                Severity::Error,
                format!("the node at {url} could not run the checks: {message}"),
                "see that node's log (`--log debug`) for the cause",
            ),
        });
    }
    for p in peers.unwrap_or_default() {
        peer_problems(p, &mut out);
    }
    local_problems(local, &mut out);
    out.sort_by_key(|p| p.severity != Severity::Error);
    out
}

/// How a peer is named in a sentence: its host name and the end of its id.
pub fn peer_name(p: &PeerReport) -> String {
    let tail: String = {
        let chars: Vec<char> = p.id.chars().collect();
        chars[chars.len().saturating_sub(6)..].iter().collect()
    };
    match &p.name {
        Some(n) => format!("{n} (…{tail})"),
        None => format!("…{tail}"),
    }
}

fn peer_problems(p: &PeerReport, out: &mut Vec<Problem>) {
    let who = peer_name(p);
    if !p.reachable {
        let why = if p.errors.is_empty() {
            "no answer".to_string()
        } else {
            p.errors.join("; ")
        };
        out.push(problem(
            Severity::Error,
            format!("peer {who} is unreachable: {why}"),
            "check that `shoal serve` runs there and that the network lets TCP through to its cluster port (52416 by default)",
        ));
        return;
    }
    if p.loss > 0.0 {
        out.push(problem(
            error_if(p.loss >= LOSSY),
            format!(
                "{:.0}% of pings to {who} went unanswered within a second",
                p.loss * 100.0
            ),
            "the link drops or stalls: check the cable or Wi-Fi signal, and for a transfer saturating it",
        ));
    }
    if let Some(rtt) = p.rtt_p99_ms.filter(|r| *r > SLOW_RTT_MS) {
        out.push(problem(
            Severity::Warning,
            format!("round trips to {who} reach {rtt:.0} ms (p99)"),
            "a pipeline across this link waits that long per token: prefer a wired link",
        ));
    }
    for (dir, bps) in [("to", p.up_bps), ("from", p.down_bps)] {
        match bps {
            None => out.push(problem(
                Severity::Warning,
                format!("the bandwidth {dir} {who} could not be measured"),
                "see `errors` in `shoal doctor --json` and both nodes' logs",
            )),
            Some(b) if b < SLOW_LINK_BPS => out.push(problem(
                Severity::Warning,
                format!("sending {dir} {who} runs at {:.1} Mbit/s", b / 1e6),
                "activations and model downloads over this link will be slow: use Ethernet or a faster network",
            )),
            Some(_) => {}
        }
    }
    if let Some(skew) = p.clock_offset_ms.filter(|s| s.abs() > SKEW_WARN_MS) {
        out.push(problem(
            error_if(skew.abs() > SKEW_ERROR_MS),
            format!(
                "{who}'s clock is {:.1} s {} this one's",
                skew.abs() / 1e3,
                if skew > 0.0 { "ahead of" } else { "behind" }
            ),
            "synchronise the clocks (NTP: `timedatectl set-ntp true`); invites and logs depend on them",
        ));
    }
}

fn local_problems(local: &LocalReport, out: &mut Vec<Problem>) {
    if local.simd == "scalar" && cfg!(target_arch = "x86_64") {
        out.push(problem(
            Severity::Warning,
            "this CPU has no AVX2: the portable kernels run, several times slower".into(),
            "give this machine few layers, or none (`shoal serve --no-auto-instance` and pinned placements)",
        ));
    }
    let total = local.memory_total_bytes;
    if total > 0 && (local.memory_available_bytes as f64) < 0.1 * total as f64 {
        out.push(problem(
            Severity::Warning,
            format!(
                "memory is nearly full: {:.1} of {:.1} GiB available",
                gib(local.memory_available_bytes),
                gib(total)
            ),
            "close other programs, or lower --kv-budget-mib so models fit",
        ));
    }
    if let Some(p) = local.memory_pressure.filter(|p| *p > 0.1) {
        let what = match local.memory_pressure_source.as_deref() {
            Some(source) if !source.starts_with("PSI") => {
                format!("the kernel reports memory pressure ({source})")
            }
            _ => format!(
                "tasks waited for memory {:.0}% of the last 10 s (memory pressure)",
                p * 100.0
            ),
        };
        out.push(problem(
            error_if(p > 0.5),
            what,
            "the machine is swapping or reclaiming: free memory or run smaller models here",
        ));
    }
    if let Some(t) = local.thermal.as_ref().filter(|t| t.throttled) {
        out.push(problem(
            Severity::Warning,
            format!(
                "the OS reports thermal pressure {}: it slows the CPU",
                t.state
            ),
            "let the machine cool (airflow, a lighter load) before measuring or serving here",
        ));
    }
    if local.models.is_empty() {
        out.push(problem(
            Severity::Warning,
            format!("no models in {}", local.models_dir.display()),
            "`shoal pull` fetches the default model (`shoal serve` does too, from peers first)",
        ));
    }
    for m in &local.models {
        if m.state != "complete" {
            out.push(problem(
                Severity::Warning,
                format!(
                    "{} is partial: {:.0} of {:.0} MB",
                    m.id,
                    m.have as f64 / 1e6,
                    m.size as f64 / 1e6
                ),
                &format!("`shoal pull {}` resumes it", m.id),
            ));
            continue;
        }
        let broken = match &m.checksum {
            Checksum::Mismatch { expected, got } => {
                Some(format!("its sha256 is {got}, not the {expected} recorded"))
            }
            Checksum::WrongSize { expected, got } => Some(format!(
                "its file has {got} bytes, not the {expected} recorded"
            )),
            Checksum::Unreadable { error } => Some(format!("its file cannot be read: {error}")),
            _ => None,
        };
        if let Some(why) = broken {
            out.push(problem(
                Severity::Error,
                format!("{} is damaged: {why}", m.id),
                &format!("`shoal rm {0}` then `shoal pull {0}`", m.id),
            ));
        }
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// 1 when some problem is an error, else 0.
pub fn exit_status(problems: &[Problem]) -> i32 {
    i32::from(problems.iter().any(|p| p.severity == Severity::Error))
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::local::ModelCheck;
    use super::*;

    pub(crate) fn healthy_local() -> LocalReport {
        LocalReport {
            host: "box".into(),
            cpu_model: "cpu".into(),
            cores: 8,
            simd: "avx2".into(),
            simd_supported: vec!["scalar".into(), "avx2".into()],
            memory_total_bytes: 16 << 30,
            memory_available_bytes: 8 << 30,
            memory_pressure: Some(0.0),
            memory_pressure_source: Some("PSI some avg10".into()),
            core_kinds: None,
            thermal: None,
            interfaces: Vec::new(),
            gpus: Vec::new(),
            models_dir: "/models".into(),
            models: vec![ModelCheck {
                id: "m".into(),
                state: "complete".into(),
                size: 10,
                have: 10,
                file: Some("/models/m/m.gguf".into()),
                checksum: Checksum::Recorded {
                    sha256: "ab".into(),
                },
            }],
        }
    }

    pub(crate) fn healthy_peer() -> PeerReport {
        PeerReport {
            id: "12D3KooWabcdefXYZ123".into(),
            name: Some("laptop".into()),
            addr: Some("10.0.0.2".into()),
            link_kind: Some(shoal_placement::LinkKind::Ethernet),
            reachable: true,
            pings_sent: 50,
            pings_answered: 50,
            loss: 0.0,
            rtt_p50_ms: Some(0.3),
            rtt_p99_ms: Some(0.9),
            up_bps: Some(940e6),
            down_bps: Some(930e6),
            mtu: Some(1500),
            mtu_source: Some("kernel".into()),
            clock_offset_ms: Some(0.2),
            errors: Vec::new(),
        }
    }

    #[test]
    fn a_healthy_cluster_has_no_problem_and_exits_0() {
        let p = find(&healthy_local(), Some(&[healthy_peer()]), None);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(exit_status(&p), 0);
    }

    #[test]
    fn no_node_is_an_error_with_the_hint_to_start_one() {
        let url = "http://127.0.0.1:52415".to_string();
        let p = find(&healthy_local(), None, Some(&NodeFailure::NoNode { url }));
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].what, "no shoal node answers at http://127.0.0.1:52415");
        assert_eq!(
            p[0].hint,
            "start one with `shoal serve` (or point --url at a running node)"
        );
        assert_eq!(exit_status(&p), 1);
    }

    #[test]
    fn an_unreachable_peer_is_an_error_naming_it_and_why() {
        let mut peer = healthy_peer();
        peer.reachable = false;
        peer.errors = vec!["none of 50 pings was answered".into()];
        let p = find(&healthy_local(), Some(&[peer]), None);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(
            p[0].what,
            "peer laptop (…XYZ123) is unreachable: none of 50 pings was answered"
        );
        assert!(p[0].hint.starts_with("check that `shoal serve` runs there"));
        assert_eq!(exit_status(&p), 1);
    }

    #[test]
    fn slow_lossy_skewed_links_warn_and_only_heavy_loss_fails() {
        let mut peer = healthy_peer();
        peer.loss = 0.04;
        peer.rtt_p99_ms = Some(120.0);
        peer.up_bps = Some(8e6);
        peer.down_bps = None;
        peer.clock_offset_ms = Some(-2500.0);
        let p = find(&healthy_local(), Some(&[peer.clone()]), None);
        let whats: Vec<&str> = p.iter().map(|x| x.what.as_str()).collect();
        assert_eq!(
            whats,
            [
                "4% of pings to laptop (…XYZ123) went unanswered within a second",
                "round trips to laptop (…XYZ123) reach 120 ms (p99)",
                "sending to laptop (…XYZ123) runs at 8.0 Mbit/s",
                "the bandwidth from laptop (…XYZ123) could not be measured",
                "laptop (…XYZ123)'s clock is 2.5 s behind this one's",
            ]
        );
        assert!(p.iter().all(|x| x.severity == Severity::Warning));
        assert_eq!(exit_status(&p), 0);
        peer.loss = 0.3;
        let p = find(&healthy_local(), Some(&[peer]), None);
        assert_eq!(p[0].severity, Severity::Error);
        assert_eq!(exit_status(&p), 1);
    }

    #[test]
    fn local_problems_name_the_model_and_the_fix() {
        let mut local = healthy_local();
        local.models.push(ModelCheck {
            id: "big".into(),
            state: "partial".into(),
            size: 4_000_000_000,
            have: 1_000_000_000,
            file: None,
            checksum: Checksum::NoneRecorded,
        });
        local.models[0].checksum = Checksum::Mismatch {
            expected: "ab".into(),
            got: "cd".into(),
        };
        local.memory_pressure = Some(0.3);
        let p = find(&local, Some(&[]), None);
        assert_eq!(p[0].severity, Severity::Error, "errors first: {p:?}");
        assert_eq!(
            p[0].what,
            "m is damaged: its sha256 is cd, not the ab recorded"
        );
        assert_eq!(p[0].hint, "`shoal rm m` then `shoal pull m`");
        assert!(p.iter().any(|x| x.what == "big is partial: 1000 of 4000 MB"
            && x.hint == "`shoal pull big` resumes it"));
        assert!(
            p.iter()
                .any(|x| x.what.starts_with("tasks waited for memory 30%"))
        );
    }

    #[test]
    fn macos_pressure_and_heat_are_named_by_level() {
        let mut local = healthy_local();
        local.memory_pressure = Some(1.0);
        local.memory_pressure_source = Some("kernel level critical".into());
        local.thermal = Some(shoal_cluster::facts::Thermal {
            state: "heavy".into(),
            throttled: true,
        });
        let p = find(&local, Some(&[]), None);
        let memory = p
            .iter()
            .find(|x| x.what == "the kernel reports memory pressure (kernel level critical)")
            .expect("the level is named");
        assert_eq!(memory.severity, Severity::Error);
        assert!(p.iter().any(|x| x.severity == Severity::Warning
            && x.what == "the OS reports thermal pressure heavy: it slows the CPU"));
        local.thermal = Some(shoal_cluster::facts::Thermal {
            state: "moderate".into(),
            throttled: false,
        });
        local.memory_pressure = Some(0.0);
        assert!(find(&local, Some(&[]), None).is_empty());
    }
}
