//! What the dashboard's feed sends: [`build`] turns the body of `GET /state` (this node's view of the
//! cluster, [`crate::cluster::state_value`]) into the page's one [`Snapshot`] — nodes (the facts a
//! person reads, their GPUs' name, vendor, type and backend, and the tokens per second each serves),
//! links (both directions' live bytes per second), instances (stages and their load progress),
//! downloads and models (offline when no node has them complete). [`Rates`] remembers recent token
//! counters so a node's tok/s is a rate, not a total.
//!
//! The snapshot is typed: every field the page's script (`app.js`) reads is a field of one of the
//! structs below, serialised once, so renaming one is a change here the page must follow, never a
//! silently missing value. Facts passed on as the cluster publishes them (a node's memory, an
//! instance's measured figures) stay JSON values.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

/// How far back a node's tokens-per-second rate looks.
const RATE_WINDOW: Duration = Duration::from_secs(3);

/// Recent token counters per node, for its served tokens per second.
#[derive(Debug, Default)]
pub struct Rates {
    samples: HashMap<String, VecDeque<(Instant, u64)>>,
}

impl Rates {
    /// Records `node`'s token total at `now` and returns its rate over the last [`RATE_WINDOW`]
    /// (0 until two samples are half a second apart; a total that went down — an instance removed —
    /// starts the window again).
    pub fn rate(&mut self, node: &str, total: u64, now: Instant) -> f64 {
        let q = self.samples.entry(node.to_string()).or_default();
        if q.back().is_some_and(|&(_, t)| t > total) {
            q.clear();
        }
        q.push_back((now, total));
        while q.len() > 2
            && q.get(1)
                .is_some_and(|&(t, _)| now.duration_since(t) >= RATE_WINDOW)
        {
            q.pop_front();
        }
        match (q.front(), q.back()) {
            (Some(&(t0, v0)), Some(&(t1, v1))) => {
                let dt = t1.duration_since(t0).as_secs_f64();
                if dt < 0.5 {
                    return 0.0;
                }
                ((v1 - v0) as f64 / dt * 10.0).round() / 10.0
            }
            _ => 0.0,
        }
    }

    /// Forgets nodes that are gone.
    fn keep(&mut self, nodes: &BTreeSet<String>) {
        self.samples.retain(|n, _| nodes.contains(n));
    }
}

/// The dashboard's snapshot: what one event of `GET /dashboard/events` carries.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Snapshot {
    /// This node's id.
    pub node: String,
    /// The coordinator's id (empty while there is none).
    pub coordinator: String,
    pub nodes: Vec<NodeView>,
    pub links: Vec<LinkView>,
    pub instances: Vec<InstanceView>,
    /// Every node's downloads.
    pub downloads: Vec<DownloadView>,
    /// The models the cluster knows of, by id.
    pub models: Vec<ModelView>,
}

/// A node as its card shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct NodeView {
    pub id: String,
    /// Host name.
    pub name: String,
    /// Base URL of its API; null when it published none.
    #[schema(value_type = Option<String>)]
    pub api_url: Value,
    /// Its memory facts as published (`total`, `available` bytes; `pressure`, `used` shares).
    #[schema(value_type = Object)]
    pub memory: Value,
    pub cpu_cores: u64,
    /// The CPU's model name; empty where not published.
    pub cpu_model: String,
    /// Its performance and efficiency cores (`{"performance", "efficiency"}`); null where the OS
    /// does not tell them apart.
    #[schema(value_type = Option<Object>)]
    pub core_kinds: Value,
    /// The OS's thermal state (`{"state", "throttled"}`, macOS); null where it has none.
    #[schema(value_type = Option<Object>)]
    pub thermal: Value,
    /// Share of all cores busy, in [0, 1]; null where unknown.
    #[schema(value_type = Option<f64>)]
    pub cpu_load: Value,
    /// Hottest temperature sensor, °C; null where unknown.
    #[schema(value_type = Option<f64>)]
    pub temperature_c: Value,
    /// CPU package power, watts; null where unknown.
    #[schema(value_type = Option<f64>)]
    pub power_w: Value,
    /// `cpu`, or the accelerator that runs the model.
    pub accelerator: String,
    /// Compute backend in use, e.g. `cpu-avx2`.
    pub backend: String,
    /// Its GPUs, in discovery order (empty for nodes that predate GPUs).
    pub gpus: Vec<GpuView>,
    /// Which GPU it offers the planner (`cpu`, `auto` or `{"gpu": index}`), as published.
    #[schema(schema_with = crate::schema::device_choice)]
    pub device: Value,
    /// Unix seconds when its process started; null when not published.
    #[schema(value_type = Option<u64>)]
    pub started: Value,
    /// Whether it is the node answering.
    pub me: bool,
    /// Whether it is the coordinator.
    pub coordinator: bool,
    /// Requests running and queued on the instances it drives.
    pub running: u64,
    pub queued: u64,
    /// Tokens per second those instances generated lately.
    pub tok_s: f64,
}

/// A GPU as the node card shows it (its driver and unknown memory left out).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct GpuView {
    pub name: String,
    pub vendor: String,
    pub device_type: String,
    pub backend: String,
    /// Device memory in bytes; null where not read.
    #[schema(value_type = Option<u64>)]
    pub memory_total: Value,
    /// The GPU probe's decode rate for the commonest weight type; null until measured.
    #[schema(value_type = Option<f64>)]
    pub q4_k_bytes_per_s: Value,
}

/// A link, with the bytes per second its two ends measured sending to each other.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct LinkView {
    pub a: String,
    pub b: String,
    /// `loopback`, `ethernet`, `wifi`, … as published.
    #[schema(value_type = Option<String>)]
    pub kind: Value,
    #[schema(value_type = Option<f64>)]
    pub rtt_us: Value,
    #[schema(value_type = Option<f64>)]
    pub bandwidth_bps: Value,
    pub a_to_b_bytes_per_s: f64,
    pub b_to_a_bytes_per_s: f64,
}

/// An instance: its stages and figures.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct InstanceView {
    #[schema(value_type = String)]
    pub id: Value,
    #[schema(value_type = String)]
    pub model: Value,
    /// `loading`, `ready`, `failed`, … as published.
    #[schema(value_type = String)]
    pub status: Value,
    pub stages: Vec<StageView>,
    /// The planner's predicted decode rate; null when not predicted.
    #[schema(value_type = Option<f64>)]
    pub predicted_tok_s: Value,
    /// What the driver measured (`running`, `finished`, `decode_tok_s`, `ttft_ms`, speculative
    /// decoding's `spec_passes`, `drafted_tokens`, `accepted_tokens`), as published.
    #[schema(value_type = Option<Object>)]
    pub measured: Value,
}

/// One stage of an instance: its node, layers, and load state.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct StageView {
    #[schema(value_type = String)]
    pub node: Value,
    #[schema(value_type = u64)]
    pub start: Value,
    #[schema(value_type = u64)]
    pub end: Value,
    /// Its first layers on a GPU of its node (`{index, layers}`), when its record says so.
    #[schema(value_type = Option<Object>)]
    pub gpu: Value,
    /// The tensor-parallel group computing it with `node` (`{members, weights}`), when it has one.
    #[schema(value_type = Option<Object>)]
    pub group: Value,
    /// `downloading`, `loading`, `ready` or `failed`; null until its node reports.
    #[schema(value_type = Option<String>)]
    pub state: Value,
    /// Bytes fetched of those needed, while downloading.
    #[schema(value_type = Option<u64>)]
    pub done: Value,
    #[schema(value_type = Option<u64>)]
    pub needed: Value,
    /// Why it failed.
    #[schema(value_type = Option<String>)]
    pub error: Value,
}

/// A download, with the node that runs it (its sources left out).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DownloadView {
    pub model: String,
    /// `running`, `done`, `failed` or `cancelled`.
    pub state: String,
    pub needed: u64,
    pub done: u64,
    pub file_size: u64,
    pub bytes_per_s: f64,
    /// Seconds left at the current speed.
    pub eta_s: Option<f64>,
    pub refused_chunks: u64,
    pub error: Option<String>,
    /// The node that runs it.
    pub node: String,
}

/// A model the cluster knows of.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ModelView {
    pub id: String,
    /// Whether some node has it complete.
    pub online: bool,
    /// The nodes that have it complete.
    pub nodes: Vec<String>,
    /// Its layer count; null for an offline model.
    pub layers: Option<u64>,
    /// Its size in bytes; null for an offline model.
    pub bytes: Option<u64>,
    #[schema(value_type = Option<u64>)]
    pub context_length: Value,
}

/// The dashboard's snapshot from `state` (the body of `GET /state`), with tok/s rates at `now`.
pub fn build(state: &Value, rates: &mut Rates, now: Instant) -> Snapshot {
    let me = state["node"].as_str().unwrap_or_default();
    let cluster = &state["cluster"];
    let coordinator = cluster["coordinator"].as_str().unwrap_or_default();
    let facts: Vec<&Value> = list(&cluster["nodes"]).iter().collect();
    let ids: BTreeSet<String> = facts.iter().map(|f| str_of(f, "id")).collect();
    rates.keep(&ids);
    let nodes = facts
        .iter()
        .map(|f| node(f, me, coordinator, rates, now))
        .collect();
    Snapshot {
        node: me.to_string(),
        coordinator: coordinator.to_string(),
        nodes,
        links: links(&cluster["links"], &facts),
        instances: list(&cluster["instances"]).iter().map(instance).collect(),
        downloads: downloads(&facts),
        models: models(&facts, &cluster["instances"]),
    }
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

fn str_of(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_default().to_string()
}

/// One node as the page shows it: the facts a person reads, whether it is this node or the
/// coordinator, and what the instances it drives are doing.
fn node(f: &Value, me: &str, coordinator: &str, rates: &mut Rates, now: Instant) -> NodeView {
    let id = str_of(f, "id");
    let loads: Vec<&Value> = f["load"]
        .as_object()
        .map(|m| m.values().collect())
        .unwrap_or_default();
    let sum = |key: &str| loads.iter().filter_map(|l| l[key].as_u64()).sum::<u64>();
    let tok_s = rates.rate(&id, sum("generated_tokens"), now);
    NodeView {
        name: str_of(f, "name"),
        api_url: f["api_url"].clone(),
        memory: f["memory"].clone(),
        cpu_cores: f["cpu_cores"].as_u64().unwrap_or(0),
        cpu_model: str_of(f, "cpu_model"),
        core_kinds: f["core_kinds"].clone(),
        thermal: f["thermal"].clone(),
        cpu_load: f["cpu_load"].clone(),
        temperature_c: f["temperature_c"].clone(),
        power_w: f["power_w"].clone(),
        accelerator: str_of(f, "accelerator"),
        backend: str_of(f, "backend"),
        // Only what the card shows, a list even from nodes that predate GPUs.
        gpus: list(&f["gpus"]).iter().map(gpu).collect(),
        device: f["device"].clone(),
        started: f["started"].clone(),
        me: id == me,
        coordinator: id == coordinator,
        running: sum("running"),
        queued: sum("queued"),
        tok_s,
        id,
    }
}

/// A GPU as the node card shows it.
fn gpu(g: &Value) -> GpuView {
    GpuView {
        name: str_of(g, "name"),
        vendor: str_of(g, "vendor"),
        device_type: str_of(g, "device_type"),
        backend: str_of(g, "backend"),
        memory_total: g["memory_total"].clone(),
        q4_k_bytes_per_s: g["compute"]["weight_bytes_per_s"]["q4_k"].clone(),
    }
}

/// The cluster's links, each with the bytes per second its two ends measured sending to each other.
fn links(links: &Value, facts: &[&Value]) -> Vec<LinkView> {
    let sent = |from: &str, to: &str| -> Option<f64> {
        let f = facts.iter().find(|f| f["id"] == from)?;
        let l = list(&f["links"]).iter().find(|l| l["peer"] == to)?;
        l["tx_bytes_per_s"].as_f64()
    };
    list(links)
        .iter()
        .map(|l| {
            let (a, b) = (str_of(l, "a"), str_of(l, "b"));
            LinkView {
                kind: l["kind"].clone(),
                rtt_us: l["rtt_us"].clone(),
                bandwidth_bps: l["bandwidth_bps"].clone(),
                a_to_b_bytes_per_s: sent(&a, &b).unwrap_or(0.0),
                b_to_a_bytes_per_s: sent(&b, &a).unwrap_or(0.0),
                a,
                b,
            }
        })
        .collect()
}

/// An instance: its stages (node, layers — those on a GPU —, each stage's load state) and figures.
fn instance(i: &Value) -> InstanceView {
    let stages = list(&i["stages"])
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let status = &i["stage_status"][k];
            StageView {
                node: s["node"].clone(),
                start: s["start"].clone(),
                end: s["end"].clone(),
                gpu: s["gpu"].clone(),
                group: s["group"].clone(),
                state: status["state"].clone(),
                done: status["done"].clone(),
                needed: status["needed"].clone(),
                error: status["error"].clone(),
            }
        })
        .collect();
    InstanceView {
        id: i["id"].clone(),
        model: i["model"].clone(),
        status: i["status"].clone(),
        stages,
        predicted_tok_s: i["predicted"]["decode_tok_s"].clone(),
        measured: i["measured"].clone(),
    }
}

/// Every node's downloads, with the node that runs each (one that does not read as a download is
/// left out).
fn downloads(facts: &[&Value]) -> Vec<DownloadView> {
    facts
        .iter()
        .flat_map(|f| {
            list(&f["downloads"]).iter().filter_map(move |d| {
                let d: shoal_cluster::facts::DownloadFacts =
                    serde_json::from_value(d.clone()).ok()?;
                Some(DownloadView {
                    model: d.model.to_string(),
                    state: d.state,
                    needed: d.needed,
                    done: d.done,
                    file_size: d.file_size,
                    bytes_per_s: d.bytes_per_s,
                    eta_s: d.eta_s,
                    refused_chunks: d.refused_chunks,
                    error: d.error,
                    node: str_of(f, "id"),
                })
            })
        })
        .collect()
}

/// The models the cluster knows of: those some node has complete (online, with the nodes that have
/// them), and those only an instance or a download names (offline: no node can load them yet).
fn models(facts: &[&Value], instances: &Value) -> Vec<ModelView> {
    let mut known: BTreeMap<String, (Vec<String>, Value)> = BTreeMap::new();
    for f in facts {
        for card in list(&f["models"]) {
            let e = known
                .entry(str_of(card, "id"))
                .or_insert_with(|| (Vec::new(), card.clone()));
            e.0.push(str_of(f, "id"));
        }
    }
    let named = list(instances).iter().map(|i| str_of(i, "model")).chain(
        facts
            .iter()
            .flat_map(|f| list(&f["downloads"]).iter().map(|d| str_of(d, "model"))),
    );
    for id in named.filter(|id| !id.is_empty()) {
        known.entry(id).or_insert((Vec::new(), Value::Null));
    }
    known
        .into_iter()
        .map(|(id, (nodes, card))| {
            let layers = card["n_layers"].as_u64();
            let bytes = layers.map(|n| {
                n * card["layer_bytes"].as_u64().unwrap_or(0)
                    + card["embed_bytes"].as_u64().unwrap_or(0)
                    + card["head_bytes"].as_u64().unwrap_or(0)
            });
            ModelView {
                id,
                online: !nodes.is_empty(),
                nodes,
                layers,
                bytes,
                context_length: card["context_length"].clone(),
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
