//! `shoal doctor`'s network half: fresh measurements of the link to each peer, over the cluster's own
//! connections (the path the data plane prefers), for a report a person or a script reads.
//!
//! - [`PeerTarget`]: a peer the network task knows (connected, being redialed after it was lost, or a
//!   static peer never reached), with its link kind and the address of its preferred path.
//! - [`check_peer`]: on a connected peer, [`DoctorOptions::pings`] pings (round trip p50 / p99, loss =
//!   unanswered within [`DoctorOptions::ping_timeout`], the peer's clock offset from the fastest ping),
//!   a timed transfer each way (bandwidth up = this node → peer, down = peer → this node), and the path
//!   MTU of the route to its address ([`mtu`]); a peer without a connection is reported unreachable
//!   with why. Each measurement opens its own stream through an [`Opener`] (the network task's
//!   `PathControl`, on the preferred connection).
//! - [`serve`]: every node answers the protocol ([`wire`]: ping with its wall clock, sink, source).
//! - [`stats`]: percentiles, loss, clock offset, bits per second.
//!
//! Data flow: `POST /doctor` → `ClusterHandle::doctor` asks the network task for the targets, then runs
//! [`check_peers`] here (pings of every peer at once, transfers one peer at a time so they do not share
//! this node's link) → a [`PeerReport`] per peer → JSON → the `shoal doctor` CLI, which adds this
//! node's own part and the problems.

pub mod mtu;
pub mod stats;
pub mod wire;

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use futures::{AsyncRead, AsyncWrite, StreamExt};
use libp2p::StreamProtocol;
use serde::{Deserialize, Serialize};
use shoal_placement::LinkKind;

/// The doctor's stream protocol.
pub const DOCTOR_PROTOCOL: StreamProtocol = StreamProtocol::new("/shoal/doctor/1");

/// Why one measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{what} timed out")]
    Timeout { what: &'static str },
    #[error("the peer broke the doctor protocol: {message}")]
    Protocol { message: String },
}

/// What to measure and how long to try.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DoctorOptions {
    /// Pings per peer.
    pub pings: usize,
    /// Pause between two answered pings.
    pub ping_interval: Duration,
    /// A ping not answered within this is lost.
    pub ping_timeout: Duration,
    /// How long each transfer sends.
    pub transfer_for: Duration,
    /// The most bytes one transfer sends.
    pub transfer_cap: u64,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            pings: 50,
            ping_interval: Duration::from_millis(10),
            ping_timeout: Duration::from_secs(1),
            transfer_for: Duration::from_secs(2),
            transfer_cap: 512 << 20,
        }
    }
}

impl DoctorOptions {
    /// The longest a stream may take to open, and a transfer beyond its sending time (a slow link's
    /// queue drains, the answer comes back).
    const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
    const TRANSFER_GRACE: Duration = Duration::from_secs(10);
}

/// A peer to check.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerTarget {
    /// The peer's node id, or a static peer's address when it was never reached.
    pub id: String,
    /// Its host name, when its facts are known.
    pub name: Option<String>,
    /// How this node reaches it (as classified when the connection came up).
    pub kind: Option<LinkKind>,
    /// The peer's address on the preferred path; `None` without a connection.
    pub addr: Option<IpAddr>,
    /// Why there is no connection (lost since when, redialing which addresses), when there is none.
    pub unconnected: Option<String>,
}

/// What was measured to one peer. Rates in bits per second, times in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerReport {
    /// As [`PeerTarget::id`].
    pub id: String,
    pub name: Option<String>,
    pub addr: Option<String>,
    /// `loopback`, `ethernet`, `wifi`, `thunderbolt`, … (`None`: no connection).
    pub link_kind: Option<LinkKind>,
    /// Some ping was answered.
    pub reachable: bool,
    pub pings_sent: usize,
    pub pings_answered: usize,
    /// Share of pings not answered in time, in [0, 1].
    pub loss: f64,
    pub rtt_p50_ms: Option<f64>,
    pub rtt_p99_ms: Option<f64>,
    /// This node → the peer.
    pub up_bps: Option<f64>,
    /// The peer → this node.
    pub down_bps: Option<f64>,
    pub mtu: Option<u32>,
    /// How `mtu` was found ([`mtu::SOURCE`]).
    pub mtu_source: Option<String>,
    /// How far the peer's clock is ahead of this node's (negative: behind).
    pub clock_offset_ms: Option<f64>,
    /// What went wrong, one sentence per failed measurement.
    pub errors: Vec<String>,
}

impl PeerReport {
    fn empty(t: &PeerTarget) -> Self {
        PeerReport {
            id: t.id.clone(),
            name: t.name.clone(),
            addr: t.addr.map(|a| a.to_string()),
            link_kind: t.kind,
            reachable: false,
            pings_sent: 0,
            pings_answered: 0,
            loss: 1.0,
            rtt_p50_ms: None,
            rtt_p99_ms: None,
            up_bps: None,
            down_bps: None,
            mtu: None,
            mtu_source: None,
            clock_offset_ms: None,
            errors: Vec::new(),
        }
    }
}

/// Opens a new doctor stream to one peer (on the path chosen for it).
pub trait Opener: Send + Sync {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send;
    fn open(&self) -> impl Future<Output = Result<Self::Stream, DoctorError>> + Send;
}

/// Checks every target: pings to all at once, then the transfers one peer at a time. Reports in the
/// targets' order.
pub async fn check_peers<O: Opener>(
    targets: Vec<(PeerTarget, Option<O>)>,
    opts: DoctorOptions,
) -> Vec<PeerReport> {
    let pinged: Vec<(PeerReport, Option<O>)> = futures::stream::iter(targets)
        .map(|(t, opener)| async move {
            let mut report = PeerReport::empty(&t);
            match (&opener, &t.unconnected) {
                (Some(o), _) => ping_peer(o, &mut report, opts).await,
                (None, why) => report.errors.push(match why {
                    Some(why) => format!("no connection: {why}"),
                    None => "no connection".to_string(),
                }),
            }
            if let Some(addr) = t.addr {
                match mtu::path_mtu(addr) {
                    Ok(m) => {
                        report.mtu = Some(m);
                        report.mtu_source = Some(mtu::SOURCE.to_string());
                    }
                    Err(e) => report.errors.push(format!("path MTU unknown: {e}")),
                }
            }
            (report, opener)
        })
        .buffered(16)
        .collect()
        .await;
    let mut out = Vec::with_capacity(pinged.len());
    for (mut report, opener) in pinged {
        if let Some(o) = opener.filter(|_| report.reachable) {
            transfer_both_ways(&o, &mut report, opts).await;
        }
        out.push(report);
    }
    out
}

async fn ping_peer<O: Opener>(opener: &O, report: &mut PeerReport, opts: DoctorOptions) {
    let budget =
        opts.ping_timeout * 3 + (opts.ping_interval + opts.ping_timeout) * opts.pings as u32;
    let work = async {
        let mut stream = opened(opener).await?;
        wire::ping(
            &mut stream,
            opts.pings,
            opts.ping_interval,
            opts.ping_timeout,
        )
        .await
    };
    match tokio::time::timeout(budget, work).await {
        Ok(Ok(pings)) => {
            let s = stats::summarize(&pings);
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            report.pings_sent = s.sent;
            report.pings_answered = s.answered;
            report.loss = s.loss;
            report.reachable = s.answered > 0;
            report.rtt_p50_ms = s.rtt_p50.map(ms);
            report.rtt_p99_ms = s.rtt_p99.map(ms);
            report.clock_offset_ms = s.clock_offset_ms;
            if s.answered == 0 {
                report
                    .errors
                    .push(format!("none of {} pings was answered", s.sent));
            }
        }
        Ok(Err(e)) => report.errors.push(format!("pinging failed: {e}")),
        Err(_) => report
            .errors
            .push(format!("pinging took longer than {} s", budget.as_secs())),
    }
}

async fn transfer_both_ways<O: Opener>(opener: &O, report: &mut PeerReport, opts: DoctorOptions) {
    let up = timed_transfer(opener, opts, wire::upload).await;
    report.up_bps = note(report, up, "sending to the peer");
    let down = timed_transfer(opener, opts, wire::download).await;
    report.down_bps = note(report, down, "receiving from the peer");
}

/// One transfer on a new stream, within its sending time and [`DoctorOptions::TRANSFER_GRACE`]: bits
/// per second.
async fn timed_transfer<O: Opener>(
    opener: &O,
    opts: DoctorOptions,
    transfer: impl AsyncFnOnce(&mut O::Stream, Duration, u64) -> Result<(u64, Duration), DoctorError>,
) -> Result<Option<f64>, DoctorError> {
    let work = async {
        let mut s = opened(opener).await?;
        transfer(&mut s, opts.transfer_for, opts.transfer_cap).await
    };
    let limit = opts.transfer_for + DoctorOptions::TRANSFER_GRACE;
    let (bytes, took) =
        tokio::time::timeout(limit, work)
            .await
            .map_err(|_| DoctorError::Timeout {
                what: "the transfer",
            })??;
    Ok(stats::bits_per_second(bytes, took))
}

/// The rate, or `None` with the failure noted in the report.
fn note(report: &mut PeerReport, r: Result<Option<f64>, DoctorError>, what: &str) -> Option<f64> {
    r.unwrap_or_else(|e| {
        report.errors.push(format!("{what} failed: {e}"));
        None
    })
}

async fn opened<O: Opener>(opener: &O) -> Result<O::Stream, DoctorError> {
    tokio::time::timeout(DoctorOptions::OPEN_TIMEOUT, opener.open())
        .await
        .map_err(|_| DoctorError::Timeout {
            what: "opening a doctor stream",
        })?
}

/// Answers other nodes' doctor streams (in the background, for the life of the runtime), each within
/// [`wire::STREAM_LIMIT`]; at most [`MAX_ANSWERING`] at once (more wait).
pub fn serve(mut incoming: libp2p_stream::IncomingStreams) {
    tokio::spawn(async move {
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_ANSWERING));
        while let Some((peer, stream)) = incoming.next().await {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            tokio::spawn(async move {
                if let Err(e) = wire::answer(stream).await {
                    tracing::debug!(%peer, "doctor stream ended: {e}");
                }
                drop(slot);
            });
        }
    });
}

/// Doctor streams answered at once: a doctor run opens a few per peer; more would only share the link.
const MAX_ANSWERING: usize = 16;
