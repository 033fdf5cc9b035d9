//! What the dashboard's feed sends: [`build`] turns the body of `GET /state` (this node's view of the
//! cluster, [`crate::cluster::state_value`]) into the page's one JSON snapshot — nodes (with the facts a
//! person reads, any optional ones passed through, their GPUs' name, vendor, type and backend, and the
//! tokens per second each serves), links (both
//! directions' live bytes per second), instances (stages and their load progress), downloads and models
//! (offline when no node has them complete). [`Rates`] remembers recent token counters so a node's
//! tok/s is a rate, not a total.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

/// Node facts the page has no use for (large, or internal); every other field is passed on, so facts
/// added later (CPU load, temperature, power) reach the page without a change here.
const HIDDEN_NODE_FIELDS: [&str; 12] = [
    "addrs",
    "compute",
    "models",
    "links",
    "instances",
    "kv_capacity",
    "downloads",
    "removed",
    "load",
    "table_version",
    "seq",
    "speed",
];

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

/// The dashboard's snapshot from `state` (the body of `GET /state`), with tok/s rates at `now`.
pub fn build(state: &Value, rates: &mut Rates, now: Instant) -> Value {
    let me = state["node"].as_str().unwrap_or_default();
    let cluster = &state["cluster"];
    let coordinator = cluster["coordinator"].as_str().unwrap_or_default();
    let facts: Vec<&Value> = list(&cluster["nodes"]).iter().collect();
    let ids: BTreeSet<String> = facts.iter().map(|f| str_of(f, "id")).collect();
    rates.keep(&ids);
    let nodes: Vec<Value> = facts
        .iter()
        .map(|f| node(f, me, coordinator, rates, now))
        .collect();
    json!({
        "node": me,
        "coordinator": coordinator,
        "nodes": nodes,
        "links": links(&cluster["links"], &facts),
        "instances": list(&cluster["instances"]).iter().map(instance).collect::<Vec<_>>(),
        "downloads": downloads(&facts),
        "models": models(&facts, &cluster["instances"]),
    })
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

fn str_of(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_default().to_string()
}

/// One node as the page shows it: its facts without the hidden ones, whether it is this node or the
/// coordinator, and what the instances it drives are doing.
fn node(f: &Value, me: &str, coordinator: &str, rates: &mut Rates, now: Instant) -> Value {
    let id = str_of(f, "id");
    let mut out: Map<String, Value> = f
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !HIDDEN_NODE_FIELDS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let loads: Vec<&Value> = f["load"]
        .as_object()
        .map(|m| m.values().collect())
        .unwrap_or_default();
    let sum = |key: &str| loads.iter().filter_map(|l| l[key].as_u64()).sum::<u64>();
    let tok_s = rates.rate(&id, sum("generated_tokens"), now);
    out.insert("me".into(), json!(id == me));
    out.insert("coordinator".into(), json!(id == coordinator));
    out.insert("running".into(), json!(sum("running")));
    out.insert("queued".into(), json!(sum("queued")));
    out.insert("tok_s".into(), json!(tok_s));
    // Replaces the facts' list: only what the card shows, a list even from nodes that predate GPUs.
    out.insert(
        "gpus".into(),
        Value::Array(list(&f["gpus"]).iter().map(gpu).collect()),
    );
    Value::Object(out)
}

/// A GPU as the node card shows it (its driver and unknown memory left out).
fn gpu(g: &Value) -> Value {
    json!({
        "name": str_of(g, "name"),
        "vendor": str_of(g, "vendor"),
        "device_type": str_of(g, "device_type"),
        "backend": str_of(g, "backend"),
        "memory_total": g["memory_total"],
        // The GPU probe's decode rate for the commonest weight type; null until measured.
        "q4_k_bytes_per_s": g["compute"]["weight_bytes_per_s"]["q4_k"],
    })
}

/// The cluster's links, each with the bytes per second its two ends measured sending to each other.
fn links(links: &Value, facts: &[&Value]) -> Vec<Value> {
    let sent = |from: &str, to: &str| -> Option<f64> {
        let f = facts.iter().find(|f| f["id"] == from)?;
        let l = list(&f["links"]).iter().find(|l| l["peer"] == to)?;
        l["tx_bytes_per_s"].as_f64()
    };
    list(links)
        .iter()
        .map(|l| {
            let (a, b) = (str_of(l, "a"), str_of(l, "b"));
            json!({
                "a": a,
                "b": b,
                "kind": l["kind"],
                "rtt_us": l["rtt_us"],
                "bandwidth_bps": l["bandwidth_bps"],
                "a_to_b_bytes_per_s": sent(&a, &b).unwrap_or(0.0),
                "b_to_a_bytes_per_s": sent(&b, &a).unwrap_or(0.0),
            })
        })
        .collect()
}

/// An instance: its stages (node, layers — those on a GPU —, each stage's load state) and figures.
fn instance(i: &Value) -> Value {
    let stages: Vec<Value> = list(&i["stages"])
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let status = &i["stage_status"][k];
            json!({
                "node": s["node"],
                "start": s["start"],
                "end": s["end"],
                // Its first layers on a GPU of its node ({index, layers}), when its record says so.
                "gpu": s["gpu"],
                "state": status["state"],
                "done": status["done"],
                "needed": status["needed"],
                "error": status["error"],
            })
        })
        .collect();
    json!({
        "id": i["id"],
        "model": i["model"],
        "status": i["status"],
        "stages": stages,
        "predicted_tok_s": i["predicted"]["decode_tok_s"],
        "measured": i["measured"],
    })
}

/// Every node's downloads, with the node that runs each.
fn downloads(facts: &[&Value]) -> Vec<Value> {
    facts
        .iter()
        .flat_map(|f| {
            list(&f["downloads"]).iter().map(move |d| {
                let mut d = d.clone();
                if let Value::Object(m) = &mut d {
                    m.insert("node".into(), f["id"].clone());
                    m.remove("sources");
                }
                d
            })
        })
        .collect()
}

/// The models the cluster knows of: those some node has complete (online, with the nodes that have
/// them), and those only an instance or a download names (offline: no node can load them yet).
fn models(facts: &[&Value], instances: &Value) -> Vec<Value> {
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
            json!({
                "id": id,
                "online": !nodes.is_empty(),
                "nodes": nodes,
                "layers": layers,
                "bytes": bytes,
                "context_length": card["context_length"],
            })
        })
        .collect()
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
