//! Every metric `GET /metrics` exports: its name, type and help text, in one place.
//!
//! [`EVENTS`] are recorded where they happen (engine, pipeline, cluster, transfer, the HTTP middleware)
//! and described once when the recorder is installed; [`STATE`] are set from the cluster snapshot at
//! each scrape (`super::state`). `docs/monitoring/` (alert rules, the Grafana board) may use only these
//! names; the tests check it against a live `/metrics`.

use metrics::{describe_counter, describe_gauge, describe_histogram};
use shoal_engine::meters::names as engine;

/// Requests answered by the HTTP API (`api`, `route`, `method`, `model`, `status`).
pub const HTTP_REQUESTS: &str = "shoal_http_requests_total";
/// Time to an HTTP response's headers (`api`, `route`).
pub const HTTP_DURATION: &str = "shoal_http_request_duration_seconds";

/// A metric's type as Prometheus shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// The word of the exposition's `# TYPE` line.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Metrics recorded at the event, with their type and help text.
pub const EVENTS: &[(&str, Kind, &str)] = &[
    (
        HTTP_REQUESTS,
        Kind::Counter,
        "HTTP requests answered, by API, route template, method, model and status.",
    ),
    (
        HTTP_DURATION,
        Kind::Histogram,
        "Time from an HTTP request to its response headers (a stream's first byte).",
    ),
    (
        engine::TTFT,
        Kind::Histogram,
        "Time from a request being queued to its first token.",
    ),
    (
        engine::ITL,
        Kind::Histogram,
        "Time between two tokens of one sequence.",
    ),
    (
        engine::E2E,
        Kind::Histogram,
        "Time from a request being queued to its last token (finished requests).",
    ),
    (
        engine::STEP,
        Kind::Histogram,
        "Time of one engine step: a batch launched through every stage until its outputs.",
    ),
    (
        engine::PROMPT_TOKENS,
        Kind::Counter,
        "Prompt tokens of admitted requests.",
    ),
    (engine::GENERATED_TOKENS, Kind::Counter, "Tokens generated."),
    (
        engine::CACHED_TOKENS,
        Kind::Counter,
        "Prompt tokens taken from the prefix cache instead of computed.",
    ),
    (
        engine::REQUESTS,
        Kind::Counter,
        "Sequences the engine ended, by outcome (stop, length, cancelled, failed, embedding).",
    ),
    (
        engine::PREEMPTIONS,
        Kind::Counter,
        "Sequences preempted (KV dropped, recomputed later) to make room.",
    ),
    (
        engine::PREFIX_LOOKUPS,
        Kind::Counter,
        "Prompts looked up in the prefix cache.",
    ),
    (
        engine::PREFIX_HITS,
        Kind::Counter,
        "Prompts that found a cached prefix.",
    ),
    (
        engine::PREFIX_EVICTIONS,
        Kind::Counter,
        "Cached prefixes evicted.",
    ),
    (
        engine::SPEC_PASSES,
        Kind::Counter,
        "Speculative decoding: passes that verified drafted tokens.",
    ),
    (
        engine::SPEC_DRAFTED,
        Kind::Counter,
        "Speculative decoding: tokens drafted (proposed for verification).",
    ),
    (
        engine::SPEC_ACCEPTED,
        Kind::Counter,
        "Speculative decoding: drafted tokens accepted (accepted / drafted is the acceptance rate).",
    ),
    (
        engine::SPEC_TOKENS_PER_PASS,
        Kind::Histogram,
        "Speculative decoding: tokens a verification pass gave its sequence (accepted drafts plus one).",
    ),
    (
        engine::KV_POOL_CAPACITY,
        Kind::Gauge,
        "KV cache memory budget of this node.",
    ),
    (
        engine::KV_POOL_USED,
        Kind::Gauge,
        "KV cache memory reserved on this node (sequences, cached prefixes, hosted stages' shares).",
    ),
    (
        engine::KV_POOL_IDLE,
        Kind::Gauge,
        "KV buffers freed by ended sequences that this node's pool keeps for the next ones.",
    ),
    (
        "shoal_stage_step_seconds",
        Kind::Histogram,
        "Time one hosted pipeline stage takes for a batch of activations.",
    ),
    (
        "shoal_pipeline_wait_seconds",
        Kind::Histogram,
        "Time a driver waits from sending a batch down its pipeline to reading its tokens back: the remote \
         stages' step times plus every hop's (less the stages' shoal_stage_step_seconds, the hops' cost).",
    ),
    (
        "shoal_group_reduce_seconds",
        Kind::Histogram,
        "Time a tensor-parallel group's rank 0 spent in one batch's all-reduces (two a layer: sending its \
         partial sums, waiting for the slowest member's, adding them), by instance and stage.",
    ),
    (
        "shoal_instance_failures_total",
        Kind::Counter,
        "Stages of instances that failed to come up on this node, by model and error kind.",
    ),
    (
        "shoal_driver_rebuilds_total",
        Kind::Counter,
        "Drivers on this node brought up again because their pipeline broke while the instance stayed \
         in the table, by model.",
    ),
    (
        "shoal_instance_replacements_total",
        Kind::Counter,
        "Instances whose node left, placed again or dropped by the coordinator.",
    ),
    (
        "shoal_membership_changes_total",
        Kind::Counter,
        "Members that joined or left, as this node saw them.",
    ),
    (
        "shoal_download_bytes_total",
        Kind::Counter,
        "Model bytes fetched and verified, by source (peer id or host).",
    ),
    (
        "shoal_download_refused_chunks_total",
        Kind::Counter,
        "Downloaded chunks refused because their bytes did not match the manifest.",
    ),
    (
        "shoal_blob_served_bytes_total",
        Kind::Counter,
        "Model bytes this node served to peers.",
    ),
];

/// Metrics set from the cluster snapshot at each scrape.
pub const STATE: &[(&str, Kind, &str)] = &[
    (
        "shoal_node_info",
        Kind::Gauge,
        "This node (1), with its name, backend and accelerator.",
    ),
    (
        "shoal_gpu_info",
        Kind::Gauge,
        "Each GPU this node found (1), by index, with its name, vendor, backend and device type.",
    ),
    (
        "shoal_gpu_memory_total_bytes",
        Kind::Gauge,
        "A GPU's device-local memory as its driver tells it (Vulkan), by gpu index.",
    ),
    (
        "shoal_gpu_memory_free_bytes",
        Kind::Gauge,
        "What may still be allocated on a GPU (Vulkan's memory budget), by gpu index.",
    ),
    (
        "shoal_gpu_weight_bytes_per_second",
        Kind::Gauge,
        "A GPU's measured decode rate: weight bytes per second of shoal's matrix-vector kernel, by gpu index and weight type.",
    ),
    (
        "shoal_node_start_time_seconds",
        Kind::Gauge,
        "When this node's process started, Unix seconds.",
    ),
    (
        "shoal_node_cpu_cores",
        Kind::Gauge,
        "CPU cores of this node.",
    ),
    (
        "shoal_node_cpu_load_ratio",
        Kind::Gauge,
        "Share of all cores busy over the last facts refresh.",
    ),
    (
        "shoal_node_temperature_celsius",
        Kind::Gauge,
        "The hottest temperature sensor of this node.",
    ),
    (
        "shoal_node_power_watts",
        Kind::Gauge,
        "CPU package power of this node (RAPL).",
    ),
    (
        "shoal_node_memory_total_bytes",
        Kind::Gauge,
        "Memory of this node.",
    ),
    (
        "shoal_node_memory_available_bytes",
        Kind::Gauge,
        "Memory available on this node.",
    ),
    (
        "shoal_node_memory_used_ratio",
        Kind::Gauge,
        "Used share of this node's memory.",
    ),
    (
        "shoal_node_memory_pressure_ratio",
        Kind::Gauge,
        "Share of the last 10 s some task waited for memory (Linux PSI).",
    ),
    (
        "shoal_node_compute_flops",
        Kind::Gauge,
        "Floating-point operations per second this node's kernels measured.",
    ),
    (
        "shoal_node_models",
        Kind::Gauge,
        "Models complete in this node's store.",
    ),
    (
        "shoal_cluster_nodes",
        Kind::Gauge,
        "Members of the cluster as this node sees it (itself included).",
    ),
    (
        "shoal_cluster_is_coordinator",
        Kind::Gauge,
        "1 when this node is the cluster's coordinator.",
    ),
    (
        "shoal_cluster_table_version",
        Kind::Gauge,
        "Version of the instance table this node holds.",
    ),
    (
        "shoal_cluster_instances",
        Kind::Gauge,
        "Instances in the cluster's table by state, as this node sees them.",
    ),
    (
        "shoal_link_rtt_seconds",
        Kind::Gauge,
        "Round trip to a peer on the preferred path.",
    ),
    (
        "shoal_link_bandwidth_bytes_per_second",
        Kind::Gauge,
        "Bandwidth to a peer measured by the last probe.",
    ),
    (
        "shoal_link_sent_bytes_total",
        Kind::Counter,
        "Data-plane bytes sent to a peer since this node started.",
    ),
    (
        "shoal_link_received_bytes_total",
        Kind::Counter,
        "Data-plane bytes received from a peer since this node started.",
    ),
    (
        "shoal_link_send_rate_bytes_per_second",
        Kind::Gauge,
        "Data-plane bytes per second sent to a peer over the last second.",
    ),
    (
        "shoal_link_receive_rate_bytes_per_second",
        Kind::Gauge,
        "Data-plane bytes per second received from a peer over the last second.",
    ),
    (
        "shoal_link_paths",
        Kind::Gauge,
        "Connections (paths) to a peer.",
    ),
    (
        "shoal_instance_state",
        Kind::Gauge,
        "Instances this node drives, 1 for their current state (loading, ready, failed, draining).",
    ),
    (
        "shoal_instance_stage_info",
        Kind::Gauge,
        "Placement of each stage of the instances this node drives: node and layers [start, end).",
    ),
    (
        "shoal_instance_group_member_info",
        Kind::Gauge,
        "Members of each tensor-parallel stage of the instances this node drives: node, rank (0: the \
         stage's node) and weight (its share of every layer is weight / the stage's total).",
    ),
    (
        "shoal_instance_predicted_decode_tokens_per_second",
        Kind::Gauge,
        "One stream's decode rate the planner predicted for an instance this node drives.",
    ),
    (
        "shoal_instance_decode_tokens_per_second",
        Kind::Gauge,
        "One stream's decode rate measured by an instance this node drives (recent requests).",
    ),
    (
        "shoal_instance_queued_requests",
        Kind::Gauge,
        "Requests waiting in an instance this node drives.",
    ),
    (
        "shoal_stage_state",
        Kind::Gauge,
        "Stages this node runs, 1 for their current state (downloading, loading, ready, failed).",
    ),
    (
        "shoal_kv_share_capacity_tokens",
        Kind::Gauge,
        "KV tokens this node set aside for a stage it hosts for another node's instance.",
    ),
    (
        "shoal_kv_share_used_tokens",
        Kind::Gauge,
        "KV tokens a stage this node hosts for another node's instance holds of its share now.",
    ),
    (
        "shoal_engine_queue_depth",
        Kind::Gauge,
        "Requests in a model's engine on this node: running plus waiting for admission.",
    ),
    (
        "shoal_sequences_preempted",
        Kind::Gauge,
        "Sequences waiting to resume after a preemption in a model's engine on this node.",
    ),
    (
        "shoal_sequences_running",
        Kind::Gauge,
        "Sequences holding KV in a model's engine on this node.",
    ),
    (
        "shoal_sequences_waiting",
        Kind::Gauge,
        "Requests waiting for admission in a model's engine on this node.",
    ),
    (
        "shoal_engine_kv_tokens",
        Kind::Gauge,
        "KV tokens a model's engine holds (sequences plus cached prefixes).",
    ),
    (
        "shoal_download_needed_bytes",
        Kind::Gauge,
        "Bytes a download on this node needs.",
    ),
    (
        "shoal_download_done_bytes",
        Kind::Gauge,
        "Bytes of a download on this node fetched and verified.",
    ),
    (
        "shoal_download_speed_bytes_per_second",
        Kind::Gauge,
        "Current speed of a download on this node.",
    ),
    (
        "shoal_download_state",
        Kind::Gauge,
        "Downloads on this node, 1 for their state (running, done, failed, cancelled).",
    ),
];

/// Describes the event metrics to the installed recorder (its `# HELP` lines).
pub fn describe_events() {
    describe(EVENTS);
}

/// Describes `list` to the current recorder.
pub fn describe(list: &[(&'static str, Kind, &'static str)]) {
    for &(name, kind, help) in list {
        match kind {
            Kind::Counter => describe_counter!(name, help),
            Kind::Gauge => describe_gauge!(name, help),
            Kind::Histogram => describe_histogram!(name, help),
        }
    }
}

/// Every metric name with its type.
pub fn all() -> impl Iterator<Item = (&'static str, Kind)> {
    EVENTS.iter().chain(STATE).map(|&(n, k, _)| (n, k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let mut seen = std::collections::HashSet::new();
        for (name, kind) in all() {
            assert!(seen.insert(name), "{name} listed twice");
            assert!(name.starts_with("shoal_"), "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{name}"
            );
            assert_eq!(
                kind == Kind::Counter,
                name.ends_with("_total"),
                "{name}: only counters end in _total"
            );
            if kind == Kind::Histogram {
                // Speculative decoding's tokens per pass is the one count (its own buckets).
                assert!(
                    name.ends_with("_seconds") || name == engine::SPEC_TOKENS_PER_PASS,
                    "{name}: histograms are latencies in seconds"
                );
            }
        }
        assert!(seen.len() >= 50, "{} metrics", seen.len());
    }
}
