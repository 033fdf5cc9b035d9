//! `shoal doctor`: a report on this node and its links, for a person (text) or a script (`--json`).
//!
//! - `local`: this machine's part, read here without any running node ([`local::LocalReport`]).
//! - The links: `POST {url}/doctor` asks the running node to measure every peer afresh over the
//!   cluster's own connections (`shoal_cluster::doctor`: reachability, RTT p50/p99, loss, bandwidth each
//!   way, path MTU, link kind, clock offset); when no node answers, the report says so and still shows
//!   this machine's part.
//! - `problems`: the rules that turn both into [`problems::Problem`]s, each with a one-line hint; the
//!   exit status is 1 when one of them is an error.
//! - [`render`]: the text report.

mod local;
mod problems;

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use shoal_cluster::doctor::PeerReport;

use crate::cli::DoctorArgs;
use local::{Checksum, LocalReport};
use problems::{NodeFailure, Problem, Severity};

/// The whole report, as `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// No problem is an error.
    pub ok: bool,
    pub url: String,
    pub local: LocalReport,
    /// The running node's id and name, when one answered.
    pub node: Option<NodeId>,
    /// Every peer the node knows, measured; `None` when no node answered.
    pub peers: Option<Vec<PeerReport>>,
    pub problems: Vec<Problem>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct NodeId {
    #[serde(rename(deserialize = "node"))]
    pub id: String,
    pub name: String,
}

/// What `POST /doctor` answers.
#[derive(serde::Deserialize)]
struct DoctorAnswer {
    #[serde(flatten)]
    node: NodeId,
    peers: Vec<PeerReport>,
}

/// Runs the doctor; the exit status to end with (1 when a problem is an error).
pub fn run(args: &DoctorArgs) -> anyhow::Result<i32> {
    let models_dir = crate::cli::models_dir_or_default(&args.models_dir);
    let local = local::gather(&models_dir, args.verify);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let url = args.url.trim_end_matches('/').to_string();
    let answer = rt.block_on(ask_node(args, &url));
    let (node, peers, failure) = match answer {
        Ok(a) => (Some(a.node), Some(a.peers), None),
        Err(f) => (None, None, Some(f)),
    };
    let problems = problems::find(&local, peers.as_deref(), failure.as_ref());
    let report = Report {
        ok: problems::exit_status(&problems) == 0,
        url,
        local,
        node,
        peers,
        problems,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(problems::exit_status(&report.problems))
}

/// `POST /doctor` on the node at `url`.
async fn ask_node(args: &DoctorArgs, url: &str) -> Result<DoctorAnswer, NodeFailure> {
    let mut body = serde_json::Map::new();
    if let Some(n) = args.pings {
        body.insert("pings".into(), n.into());
    }
    if let Some(ms) = args.transfer_ms {
        body.insert("transfer_ms".into(), ms.into());
    }
    let mut req = reqwest::Client::new()
        .post(format!("{url}/doctor"))
        .timeout(Duration::from_secs(600))
        .json(&body);
    if let Some(key) = &args.api_key {
        req = req.bearer_auth(key);
    }
    let failed = |message: String| NodeFailure::Failed {
        url: url.to_string(),
        message,
    };
    let resp = req.send().await.map_err(|e| {
        if e.is_connect() {
            NodeFailure::NoNode {
                url: url.to_string(),
            }
        } else {
            failed(e.to_string())
        }
    })?;
    let status = resp.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Err(NodeFailure::Refused {
            url: url.to_string(),
        });
    }
    let body: serde_json::Value = resp
        .json()
        .await
        .map_err(|e| failed(format!("its answer is not JSON: {e}")))?;
    if !status.is_success() {
        let message = body["error"]["message"].as_str().unwrap_or("no message");
        return Err(failed(format!("{status}: {message}")));
    }
    serde_json::from_value(body)
        .map_err(|e| failed(format!("its answer is not a doctor report: {e}")))
}

/// The text report.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let l = &r.local;
    let _ = writeln!(s, "this node: {}", l.host);
    let kinds = match l.core_kinds {
        Some(k) if k.efficiency > 0 => {
            format!(
                " ({} performance, {} efficiency)",
                k.performance, k.efficiency
            )
        }
        _ => String::new(),
    };
    let _ = writeln!(
        s,
        "  cpu      {}, {} cores{kinds}, kernels {} (this CPU runs: {})",
        l.cpu_model,
        l.cores,
        l.simd,
        l.simd_supported.join(", ")
    );
    if let Some(t) = &l.thermal {
        let _ = writeln!(s, "  thermal  {}", t.state);
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let pressure = match (l.memory_pressure, l.memory_pressure_source.as_deref()) {
        (Some(p), Some(source)) => format!("pressure {:.1}% ({source})", p * 100.0),
        (Some(p), None) => format!("pressure {:.1}%", p * 100.0),
        (None, _) => "pressure unknown (no PSI or pressure level)".to_string(),
    };
    let _ = writeln!(
        s,
        "  memory   {:.1} GiB, {:.1} GiB available, {pressure}",
        gib(l.memory_total_bytes),
        gib(l.memory_available_bytes)
    );
    for i in &l.interfaces {
        let kind = format!("{:?}", i.kind).to_lowercase();
        let _ = writeln!(s, "  link     {} ({kind}): {}", i.name, i.addrs.join(", "));
    }
    render_gpus(&mut s, &l.gpus);
    let _ = writeln!(s, "  models   {}", l.models_dir.display());
    for m in &l.models {
        let check = match &m.checksum {
            Checksum::NoneRecorded => "no sha256 recorded".to_string(),
            Checksum::Recorded { .. } => "sha256 recorded (not hashed; --verify)".to_string(),
            Checksum::Verified { .. } => "sha256 verified".to_string(),
            Checksum::Mismatch { .. } => "sha256 MISMATCH".to_string(),
            Checksum::WrongSize { .. } => "WRONG SIZE".to_string(),
            Checksum::Unreadable { error } => format!("unreadable: {error}"),
        };
        let _ = writeln!(
            s,
            "    {:<40} {:>9.1} MB  {:<8}  {check}",
            m.id,
            m.size as f64 / 1e6,
            m.state
        );
    }
    match (&r.node, &r.peers) {
        (Some(n), Some(peers)) => {
            let _ = writeln!(s, "cluster: node {} ({}) at {}", n.name, n.id, r.url);
            if peers.is_empty() {
                let _ = writeln!(s, "  no peers");
            }
            for p in peers {
                render_peer(&mut s, p);
            }
        }
        _ => {
            let _ = writeln!(s, "cluster: no node answered at {}", r.url);
        }
    }
    if r.problems.is_empty() {
        let _ = writeln!(s, "no problems found");
    } else {
        let _ = writeln!(s, "problems:");
        for p in &r.problems {
            let tag = match p.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            let _ = writeln!(s, "  {tag}: {}\n    hint: {}", p.what, p.hint);
        }
    }
    s
}

/// One line per GPU found, or why finding none is fine.
fn render_gpus(s: &mut String, gpus: &[shoal_cluster::facts::GpuFacts]) {
    if gpus.is_empty() {
        let _ = writeln!(
            s,
            "  gpu      none found (no GPU, no driver or no Vulkan loader): fine, shoal computes on the CPU"
        );
    }
    for (i, g) in gpus.iter().enumerate() {
        let driver = [g.driver.as_str(), g.driver_info.as_str()]
            .into_iter()
            .filter(|d| !d.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        let driver = if driver.is_empty() {
            String::new()
        } else {
            format!(", driver {driver}")
        };
        let _ = writeln!(
            s,
            "  gpu      {}{driver}, {}; {}",
            crate::gpus::describe(i, g),
            crate::gpus::memory_text(g),
            crate::gpus::compute_text(g.compute.as_ref()),
        );
    }
}

fn render_peer(s: &mut String, p: &PeerReport) {
    let who = problems::peer_name(p);
    if !p.reachable {
        let _ = writeln!(s, "  peer {who}: UNREACHABLE ({})", p.errors.join("; "));
        return;
    }
    let ms = |v: Option<f64>| v.map_or("?".to_string(), |x| format!("{x:.2} ms"));
    let mbit = |v: Option<f64>| v.map_or("?".to_string(), |x| format!("{:.1} Mbit/s", x / 1e6));
    let kind = p.link_kind.map_or("unknown", kind_name);
    let _ = writeln!(
        s,
        "  peer {who}: reachable over {kind} at {}",
        p.addr.as_deref().unwrap_or("?")
    );
    let _ = writeln!(
        s,
        "    rtt p50 {} p99 {}, loss {:.0}% of {} pings, up {} down {}, mtu {}, clock {}",
        ms(p.rtt_p50_ms),
        ms(p.rtt_p99_ms),
        p.loss * 100.0,
        p.pings_sent,
        mbit(p.up_bps),
        mbit(p.down_bps),
        p.mtu.map_or("?".to_string(), |m| m.to_string()),
        p.clock_offset_ms
            .map_or("?".to_string(), |c| format!("{c:+.1} ms")),
    );
    for e in &p.errors {
        let _ = writeln!(s, "    note: {e}");
    }
}

fn kind_name(k: shoal_placement::LinkKind) -> &'static str {
    use shoal_placement::LinkKind::*;
    match k {
        Loopback => "loopback",
        Thunderbolt => "thunderbolt",
        Ethernet => "ethernet",
        Wifi => "wifi",
        Unknown => "an unknown link",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_report_shows_peers_and_problems_with_hints() {
        let local = problems::tests::healthy_local();
        let mut down = problems::tests::healthy_peer();
        down.reachable = false;
        down.errors = vec!["no connection: lost 3 s ago, redialing /ip4/10.0.0.3/tcp/52416".into()];
        down.id = "12D3KooWzzzzzzQQQ999".into();
        down.name = None;
        let peers = vec![problems::tests::healthy_peer(), down];
        let problems = problems::find(&local, Some(&peers), None);
        let report = Report {
            ok: problems::exit_status(&problems) == 0,
            url: "http://127.0.0.1:52415".into(),
            local,
            node: Some(NodeId {
                id: "12D3KooWme".into(),
                name: "box".into(),
            }),
            peers: Some(peers),
            problems,
        };
        assert!(!report.ok);
        let text = render(&report);
        assert!(
            text.contains("  peer laptop (…XYZ123): reachable over ethernet at 10.0.0.2\n"),
            "{text}"
        );
        assert!(text.contains("    rtt p50 0.30 ms p99 0.90 ms, loss 0% of 50 pings, up 940.0 Mbit/s down 930.0 Mbit/s, mtu 1500, clock +0.2 ms\n"), "{text}");
        assert!(text.contains("  peer …QQQ999: UNREACHABLE (no connection: lost 3 s ago, redialing /ip4/10.0.0.3/tcp/52416)\n"), "{text}");
        assert!(text.contains("problems:\n  error: peer …QQQ999 is unreachable: no connection: lost 3 s ago, redialing /ip4/10.0.0.3/tcp/52416\n    hint: check that `shoal serve` runs there"), "{text}");
        assert!(
            text.contains("  gpu      none found (no GPU, no driver or no Vulkan loader): fine, shoal computes on the CPU\n"),
            "{text}"
        );
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["ok"], false);
        assert_eq!(json["peers"][1]["reachable"], false);
        assert_eq!(json["problems"][0]["severity"], "error");
    }

    #[test]
    fn the_text_report_lists_each_gpu_with_its_backend_and_driver() {
        let mut local = problems::tests::healthy_local();
        local.gpus = vec![shoal_cluster::facts::GpuFacts {
            name: "llvmpipe".into(),
            vendor: "Mesa".into(),
            device_type: "cpu".into(),
            backend: "vulkan".into(),
            driver: "llvmpipe".into(),
            driver_info: "Mesa 22.3.6".into(),
            memory_total: None,
            memory_free: None,
            compute: None,
        }];
        let mut report = Report {
            ok: true,
            url: "http://127.0.0.1:52415".into(),
            local,
            node: None,
            peers: None,
            problems: Vec::new(),
        };
        let text = render(&report);
        assert!(
            text.contains("  gpu      gpu:0 llvmpipe (Mesa, cpu, vulkan), driver llvmpipe Mesa 22.3.6, memory unknown (not read on this backend); not measured yet (shoal serve --device auto or gpu:N measures it)\n"),
            "{text}"
        );
        let mut measured = shoal_cluster::facts::ComputeFacts {
            weight_bytes_per_s: [("q4_k".to_string(), 1.25e9), ("f16".to_string(), 3e9)].into(),
            flops_per_s: 4e9,
            ..Default::default()
        };
        measured.attention_flops_per_s = 2e9;
        let g = &mut report.local.gpus[0];
        (g.memory_total, g.memory_free, g.compute) = (Some(3 << 30), Some(1 << 30), Some(measured));
        let text = render(&report);
        assert!(
            text.contains(", driver llvmpipe Mesa 22.3.6, memory 3.0 GiB (1.0 GiB free); decode GB/s q4_k 1.25, f16 3.00; batched 4.0 GFLOP/s, attention 2.0 GFLOP/s\n"),
            "{text}"
        );
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["local"]["gpus"][0]["backend"], "vulkan");
    }
}
