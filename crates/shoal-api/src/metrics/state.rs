//! The state series of `GET /metrics`, set at each scrape from what the node knows now: its cluster
//! snapshot (the data `GET /state` shows), its engines' live counters and the KV its hosted stages hold.
//!
//! [`render`] builds a fresh recorder, sets every gauge in it and renders it: a node, link, instance or
//! download that no longer exists simply has no series in the next scrape (nothing to delete, nothing
//! stale). Each node exports what it owns — its own resources, links, downloads, the stages it runs and
//! the instances it drives (stage 0 is on it) — so the series of a cluster scraped on every node add
//! up without duplicates; the cluster-wide figures (`shoal_cluster_*`) are this node's view.

use metrics::{counter, gauge};
use metrics_exporter_prometheus::PrometheusBuilder;
use shoal_cluster::facts::{InstanceStatus, NodeFacts};
use shoal_cluster::state::{ClusterView, InstanceState};

use super::names;
use crate::ApiState;

/// The state series in Prometheus' text format ("" for a bare engine without a cluster and no engines).
pub fn render(state: &ApiState) -> String {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        names::describe(names::STATE);
        engines(state);
        hosted_shares();
        if let Some(cluster) = &state.cluster {
            let snap = cluster.snapshot();
            let view = snap.state.view();
            let me = snap.state.me();
            node(me);
            cluster_view(me, &view, snap.state.is_coordinator());
            links(me, &view);
            instances(me, &view);
            downloads(me);
        }
    });
    handle.render()
}

/// Queue, preempted sequences and KV of each model's engine on this node (an engine that went has
/// no series left).
fn engines(state: &ApiState) {
    for m in state.engine.models() {
        let Ok(engine) = state.engine.get(&m.id) else {
            continue;
        };
        let s = engine.stats();
        let model = m.id.clone();
        gauge!("shoal_engine_queue_depth", "model" => model.clone())
            .set(s.active_sequences.saturating_add(s.waiting) as f64);
        gauge!("shoal_sequences_running", "model" => model.clone()).set(s.active_sequences as f64);
        gauge!("shoal_sequences_waiting", "model" => model.clone()).set(s.waiting as f64);
        gauge!("shoal_sequences_preempted", "model" => model.clone()).set(s.preempted as f64);
        gauge!("shoal_engine_kv_tokens", "model" => model).set(s.kv_tokens as f64);
    }
}

/// What each stage this node hosts for another node's instance holds of its KV share.
fn hosted_shares() {
    for share in shoal_engine::meters::hosted_shares() {
        gauge!("shoal_kv_share_used_tokens", "instance_id" => share.instance, "stage" => share.stage.to_string())
            .set(share.used_tokens as f64);
    }
}

/// This node's resources.
fn node(me: &NodeFacts) {
    let id = me.id.to_string();
    gauge!("shoal_node_info", "node" => id.clone(), "name" => me.name.clone(), "backend" => me.backend.clone(), "accelerator" => me.accelerator.clone())
        .set(1.0);
    for (index, g) in me.gpus.iter().enumerate() {
        gauge!("shoal_gpu_info", "node" => id.clone(), "index" => index.to_string(),
            "name" => cut(&g.name, 64), "vendor" => cut(&g.vendor, 32),
            "backend" => known(&g.backend, &["vulkan", "metal", "dx12"]),
            "device_type" => known(&g.device_type, &["discrete", "integrated", "virtual", "cpu"]))
        .set(1.0);
        let gpu = index.to_string();
        if let Some(total) = g.memory_total {
            gauge!("shoal_gpu_memory_total_bytes", "node" => id.clone(), "gpu" => gpu.clone())
                .set(total as f64);
        }
        if let Some(free) = g.memory_free {
            gauge!("shoal_gpu_memory_free_bytes", "node" => id.clone(), "gpu" => gpu.clone())
                .set(free as f64);
        }
        // The types the GPU probe measures: a bounded set of label values.
        for (ty, rate) in g.compute.iter().flat_map(|c| &c.weight_bytes_per_s) {
            gauge!("shoal_gpu_weight_bytes_per_second", "node" => id.clone(), "gpu" => gpu.clone(),
                "type" => cut(ty, 16))
            .set(*rate);
        }
    }
    gauge!("shoal_node_start_time_seconds", "node" => id.clone()).set(me.started as f64);
    gauge!("shoal_node_cpu_cores", "node" => id.clone()).set(me.cpu_cores as f64);
    if let Some(load) = me.cpu_load {
        gauge!("shoal_node_cpu_load_ratio", "node" => id.clone()).set(f64::from(load));
    }
    if let Some(t) = me.temperature_c {
        gauge!("shoal_node_temperature_celsius", "node" => id.clone()).set(f64::from(t));
    }
    if let Some(w) = me.power_w {
        gauge!("shoal_node_power_watts", "node" => id.clone()).set(f64::from(w));
    }
    let mem = &me.memory;
    gauge!("shoal_node_memory_total_bytes", "node" => id.clone()).set(mem.total as f64);
    gauge!("shoal_node_memory_available_bytes", "node" => id.clone()).set(mem.available as f64);
    gauge!("shoal_node_memory_used_ratio", "node" => id.clone()).set(f64::from(mem.used));
    gauge!("shoal_node_memory_pressure_ratio", "node" => id.clone()).set(f64::from(mem.pressure));
    if me.compute.flops_per_s > 0.0 {
        gauge!("shoal_node_compute_flops", "node" => id.clone()).set(me.compute.flops_per_s);
    }
    gauge!("shoal_node_models", "node" => id.clone()).set(me.models.len() as f64);
    for (instance, tokens) in &me.kv_capacity {
        gauge!("shoal_kv_share_capacity_tokens", "node" => id.clone(), "instance_id" => instance.to_string())
            .set(*tokens as f64);
    }
}

/// `s` cut to at most `max` characters (a label value stays bounded).
fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// `s` when it is one of `values`, else `other`.
fn known(s: &str, values: &[&'static str]) -> &'static str {
    values.iter().find(|v| **v == s).copied().unwrap_or("other")
}

/// The cluster as this node sees it.
fn cluster_view(me: &NodeFacts, view: &ClusterView, coordinator: bool) {
    let id = me.id.to_string();
    gauge!("shoal_cluster_nodes", "node" => id.clone()).set(view.nodes.len() as f64);
    gauge!("shoal_cluster_is_coordinator", "node" => id.clone()).set(if coordinator {
        1.0
    } else {
        0.0
    });
    gauge!("shoal_cluster_table_version", "node" => id.clone()).set(view.table_version as f64);
    for s in [
        InstanceState::Loading,
        InstanceState::Ready,
        InstanceState::Failed,
        InstanceState::Draining,
    ] {
        let n = view.instances.iter().filter(|i| i.status == s).count();
        gauge!("shoal_cluster_instances", "node" => id.clone(), "state" => instance_state(s))
            .set(n as f64);
    }
}

/// This node's links to its peers.
fn links(me: &NodeFacts, view: &ClusterView) {
    let id = me.id.to_string();
    for l in &me.links {
        let peer = l.peer.to_string();
        let peer_name = view
            .nodes
            .iter()
            .find(|n| n.id == l.peer)
            .map(|n| n.name.clone())
            .unwrap_or_default();
        let kind = serde_json::to_value(l.kind)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let labels = || {
            [
                ("node", id.clone()),
                ("peer", peer.clone()),
                ("peer_name", peer_name.clone()),
                ("kind", kind.clone()),
            ]
        };
        if let Some(rtt) = l.rtt_us {
            gauge!("shoal_link_rtt_seconds", &labels()).set(rtt / 1e6);
        }
        if let Some(bw) = l.bandwidth_bps {
            gauge!("shoal_link_bandwidth_bytes_per_second", &labels()).set(bw);
        }
        counter!("shoal_link_sent_bytes_total", &labels()).absolute(l.tx_bytes);
        counter!("shoal_link_received_bytes_total", &labels()).absolute(l.rx_bytes);
        gauge!("shoal_link_send_rate_bytes_per_second", &labels()).set(l.tx_bytes_per_s);
        gauge!("shoal_link_receive_rate_bytes_per_second", &labels()).set(l.rx_bytes_per_s);
        gauge!("shoal_link_paths", &labels()).set(l.paths.len().max(1) as f64);
    }
}

/// The instances this node drives (their state, placement, prediction and measured load) and the
/// state of every stage it runs.
fn instances(me: &NodeFacts, view: &ClusterView) {
    for i in &view.instances {
        if i.record.driver() != Some(&me.id) {
            continue;
        }
        let (instance, model) = (i.record.id.to_string(), i.record.model.to_string());
        for s in [
            InstanceState::Loading,
            InstanceState::Ready,
            InstanceState::Failed,
            InstanceState::Draining,
        ] {
            gauge!("shoal_instance_state", "instance_id" => instance.clone(), "model" => model.clone(), "state" => instance_state(s))
                .set(if i.status == s { 1.0 } else { 0.0 });
        }
        for (n, st) in i.record.stages.iter().enumerate() {
            gauge!("shoal_instance_stage_info", "instance_id" => instance.clone(), "model" => model.clone(), "stage" => n.to_string(), "node" => st.node.to_string(), "start" => st.start.to_string(), "end" => st.end.to_string())
                .set(1.0);
            let weights = st.group.iter().flat_map(|g| g.weights.iter());
            for (rank, (node, w)) in st.nodes().zip(weights).enumerate() {
                gauge!("shoal_instance_group_member_info", "instance_id" => instance.clone(), "model" => model.clone(), "stage" => n.to_string(), "node" => node.to_string(), "rank" => rank.to_string(), "weight" => w.to_string())
                    .set(1.0);
            }
        }
        if let Some(rate) = i.predicted.decode_tok_s {
            gauge!("shoal_instance_predicted_decode_tokens_per_second", "instance_id" => instance.clone(), "model" => model.clone())
                .set(rate);
        }
        if let Some(load) = &i.measured {
            if let Some(rate) = load.decode_tok_s {
                gauge!("shoal_instance_decode_tokens_per_second", "instance_id" => instance.clone(), "model" => model.clone())
                    .set(rate);
            }
            gauge!("shoal_instance_queued_requests", "instance_id" => instance.clone(), "model" => model.clone())
                .set(f64::from(load.queued));
        }
    }
    for (instance, status) in &me.instances {
        for s in ["downloading", "loading", "ready", "failed"] {
            gauge!("shoal_stage_state", "node" => me.id.to_string(), "instance_id" => instance.to_string(), "state" => s)
                .set(if stage_state(status) == s { 1.0 } else { 0.0 });
        }
    }
}

/// This node's downloads.
fn downloads(me: &NodeFacts) {
    for d in &me.downloads {
        let model = d.model.to_string();
        let node = me.id.to_string();
        gauge!("shoal_download_needed_bytes", "node" => node.clone(), "model" => model.clone())
            .set(d.needed as f64);
        gauge!("shoal_download_done_bytes", "node" => node.clone(), "model" => model.clone())
            .set(d.done as f64);
        gauge!("shoal_download_speed_bytes_per_second", "node" => node.clone(), "model" => model.clone())
            .set(d.bytes_per_s);
        for s in ["running", "done", "failed", "cancelled"] {
            gauge!("shoal_download_state", "node" => node.clone(), "model" => model.clone(), "state" => s)
                .set(if d.state == s { 1.0 } else { 0.0 });
        }
    }
}

fn instance_state(s: InstanceState) -> &'static str {
    match s {
        InstanceState::Loading => "loading",
        InstanceState::Ready => "ready",
        InstanceState::Failed => "failed",
        InstanceState::Draining => "draining",
    }
}

fn stage_state(s: &InstanceStatus) -> &'static str {
    match s {
        InstanceStatus::Downloading { .. } => "downloading",
        InstanceStatus::Loading => "loading",
        InstanceStatus::Ready => "ready",
        InstanceStatus::Failed { .. } => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_labels_stay_bounded() {
        assert_eq!(cut(&"x".repeat(500), 64).len(), 64);
        assert_eq!(cut("llvmpipe", 64), "llvmpipe");
        assert_eq!(known("vulkan", &["vulkan", "metal"]), "vulkan");
        assert_eq!(
            known("a peer's novel backend", &["vulkan", "metal"]),
            "other"
        );
    }
}
