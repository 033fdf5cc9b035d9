use super::*;
use serde_json::json;

/// The snapshot as the feed sends it: its JSON.
fn snap(state: &Value, rates: &mut Rates, now: Instant) -> Value {
    serde_json::to_value(build(state, rates, now)).unwrap()
}

/// A `/state` body of two nodes `a` (this node, driving instance `i1` over both) and `b`, shaped as the
/// cluster writes it.
fn state(generated: u64) -> Value {
    let mut state = cluster(generated);
    // Facts newer nodes publish (`b` predates them), set apart: one `json!` of everything is too deep.
    let a = &mut state["cluster"]["nodes"][0];
    a["cpu_model"] = json!("Apple M2 Pro");
    a["core_kinds"] = json!({"performance": 8, "efficiency": 4});
    a["thermal"] = json!({"state": "nominal", "throttled": false});
    state
}

fn cluster(generated: u64) -> Value {
    json!({
        "node": "a",
        "cluster": {
            "coordinator": "b",
            "nodes": [
                {
                    "id": "a", "name": "alpha", "api_url": "http://a", "cpu_cores": 8,
                    "accelerator": "cpu", "backend": "cpu-avx2", "speed": 1.0, "seq": 7,
                    "gpus": [{"name": "llvmpipe", "vendor": "Mesa", "device_type": "cpu",
                              "backend": "vulkan", "driver": "llvmpipe", "driver_info": "Mesa 22",
                              "memory_total": 2147483648u64, "memory_free": null,
                              "compute": {"weight_bytes_per_s": {"q4_k": 1.5e9, "f16": 3e9}}}],
                    "addrs": ["/ip4/1.2.3.4"], "compute": {"flops_per_s": 1.0},
                    "memory": {"total": 1000, "available": 400, "pressure": 0.1, "used": 0.6},
                    "cpu_load": 0.5, "temperature_c": 61.0, "power_w": null,
                    "device": "auto", "started": 1700000000u64,
                    "models": [{"id": "m", "n_layers": 4, "layer_bytes": 10, "embed_bytes": 5,
                                "head_bytes": 5, "context_length": 2048}],
                    "links": [{"peer": "b", "kind": "ethernet", "tx_bytes_per_s": 1500.0}],
                    "instances": {"i1": {"state": "ready"}},
                    "load": {"i1": {"running": 1, "queued": 2, "generated_tokens": generated}},
                    "downloads": [{"model": "big", "state": "running", "needed": 100, "done": 25,
                                   "file_size": 100, "bytes_per_s": 5.0, "eta_s": 15.0,
                                   "sources": {"hub": 25}}],
                },
                {
                    "id": "b", "name": "beta", "cpu_cores": 4,
                    "memory": {"total": 2000, "available": 2000, "pressure": 0.0, "used": 0.0},
                    "models": [],
                    "links": [{"peer": "a", "kind": "ethernet", "tx_bytes_per_s": 300.0}],
                    "load": {},
                },
            ],
            "links": [{"a": "a", "b": "b", "kind": "ethernet", "rtt_us": 250.0, "bandwidth_bps": 1e8}],
            "instances": [{
                "id": "i1", "model": "m", "status": "loading",
                "stages": [{"node": "a", "start": 0, "end": 2, "gpu": {"index": 0, "layers": 1}},
                           {"node": "b", "start": 2, "end": 4,
                            "group": {"members": ["c"], "weights": [2, 1]}}],
                "stage_status": [{"state": "ready"}, {"state": "downloading", "done": 3, "needed": 9}],
                "predicted": {"decode_tok_s": 40.0},
                "measured": {"running": 1, "finished": 3},
            }],
        },
    })
}

#[test]
fn nodes_list_their_gpus_name_backend_memory_and_q4_k_rate_and_none_for_older_nodes() {
    let s = snap(&state(0), &mut Rates::default(), Instant::now());
    assert_eq!(
        s["nodes"][0]["gpus"],
        json!([{"name": "llvmpipe", "vendor": "Mesa", "device_type": "cpu", "backend": "vulkan",
                 "memory_total": 2147483648u64, "q4_k_bytes_per_s": 1.5e9}])
    );
    assert_eq!(
        s["nodes"][1]["gpus"],
        json!([]),
        "a node that predates GPUs has none"
    );
}

#[test]
fn nodes_keep_what_a_person_reads_and_nothing_else() {
    let s = snap(&state(0), &mut Rates::default(), Instant::now());
    let a = &s["nodes"][0];
    assert_eq!(a["name"], "alpha");
    assert_eq!(a["me"], true);
    assert_eq!(a["coordinator"], false);
    assert_eq!(s["nodes"][1]["coordinator"], true);
    assert_eq!(a["memory"]["used"], 0.6);
    assert_eq!(a["temperature_c"], 61.0);
    assert_eq!(a["cpu_model"], "Apple M2 Pro");
    assert_eq!(a["core_kinds"]["efficiency"], 4);
    assert_eq!(a["thermal"]["state"], "nominal");
    assert_eq!(a["cpu_load"], 0.5);
    assert_eq!(a["device"], "auto");
    assert_eq!(
        (a["running"].as_u64(), a["queued"].as_u64()),
        (Some(1), Some(2))
    );
    // Exactly the fields of `NodeView`: what the page reads, nothing large or internal.
    let keys: Vec<&str> = a.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "id",
            "name",
            "api_url",
            "memory",
            "cpu_cores",
            "cpu_model",
            "core_kinds",
            "thermal",
            "cpu_load",
            "temperature_c",
            "power_w",
            "accelerator",
            "backend",
            "gpus",
            "device",
            "started",
            "me",
            "coordinator",
            "running",
            "queued",
            "tok_s"
        ]
    );
    // A node that published fewer facts (an older one) still has every field, null where unknown.
    let b = &s["nodes"][1];
    assert!(b["api_url"].is_null() && b["temperature_c"].is_null());
    assert!(b["core_kinds"].is_null() && b["thermal"].is_null() && b["cpu_model"] == "");
    assert_eq!(b["cpu_cores"], 4);
}

#[test]
fn links_carry_both_directions_live_bytes() {
    let s = snap(&state(0), &mut Rates::default(), Instant::now());
    let l = &s["links"][0];
    assert_eq!(l["kind"], "ethernet");
    assert_eq!(l["rtt_us"], 250.0);
    assert_eq!(l["a_to_b_bytes_per_s"], 1500.0);
    assert_eq!(l["b_to_a_bytes_per_s"], 300.0);
}

#[test]
fn instances_show_each_stage_and_its_progress() {
    let s = snap(&state(0), &mut Rates::default(), Instant::now());
    let i = &s["instances"][0];
    assert_eq!(i["status"], "loading");
    assert_eq!(i["predicted_tok_s"], 40.0);
    let st = &i["stages"][1];
    assert_eq!(
        (st["node"].as_str(), st["start"].as_u64()),
        (Some("b"), Some(2))
    );
    assert_eq!(st["state"], "downloading");
    // Where a stage's layers run: the first on a GPU when its record says so, else nothing.
    assert_eq!(
        i["stages"][0]["gpu"],
        serde_json::json!({"index": 0, "layers": 1})
    );
    assert!(st["gpu"].is_null());
    assert_eq!(
        (st["done"].as_u64(), st["needed"].as_u64()),
        (Some(3), Some(9))
    );
}

#[test]
fn downloads_name_their_node_and_models_not_complete_anywhere_are_offline() {
    let s = snap(&state(0), &mut Rates::default(), Instant::now());
    let d = &s["downloads"][0];
    assert_eq!(
        (d["node"].as_str(), d["done"].as_u64()),
        (Some("a"), Some(25))
    );
    assert!(d.get("sources").is_none());
    let models = s["models"].as_array().unwrap();
    let find = |id: &str| models.iter().find(|m| m["id"] == id).unwrap();
    assert_eq!(find("m")["online"], true);
    assert_eq!(find("m")["nodes"], json!(["a"]));
    assert_eq!(find("m")["bytes"], 50);
    assert_eq!(find("big")["online"], false, "only a download names it");
}

#[test]
fn a_nodes_tok_s_is_the_rate_of_its_generated_tokens() {
    let mut rates = Rates::default();
    let t0 = Instant::now();
    let s = snap(&state(100), &mut rates, t0);
    assert_eq!(s["nodes"][0]["tok_s"], 0.0, "one sample is no rate");
    let s = snap(&state(150), &mut rates, t0 + Duration::from_secs(2));
    assert_eq!(s["nodes"][0]["tok_s"], 25.0);
    // Idle for longer than the window: the rate falls to zero.
    let s = snap(&state(150), &mut rates, t0 + Duration::from_secs(6));
    let s2 = snap(&state(150), &mut rates, t0 + Duration::from_secs(10));
    assert!(s["nodes"][0]["tok_s"].as_f64().unwrap() < 25.0);
    assert_eq!(s2["nodes"][0]["tok_s"], 0.0);
    // A total that went down (an instance removed) starts again instead of a negative rate.
    let s = snap(&state(10), &mut rates, t0 + Duration::from_secs(11));
    assert_eq!(s["nodes"][0]["tok_s"], 0.0);
}

#[test]
fn links_instances_downloads_and_models_are_the_json_the_page_reads() {
    let s = snap(&state(0), &mut Rates::default(), Instant::now());
    assert_eq!(
        (s["node"].as_str(), s["coordinator"].as_str()),
        (Some("a"), Some("b"))
    );
    assert_eq!(
        s["links"],
        json!([{"a": "a", "b": "b", "kind": "ethernet", "rtt_us": 250.0, "bandwidth_bps": 1e8,
                "a_to_b_bytes_per_s": 1500.0, "b_to_a_bytes_per_s": 300.0}])
    );
    assert_eq!(
        s["instances"],
        json!([{"id": "i1", "model": "m", "status": "loading", "stages": [
                   {"node": "a", "start": 0, "end": 2, "gpu": {"index": 0, "layers": 1},
                    "group": null, "state": "ready", "done": null, "needed": null, "error": null},
                   {"node": "b", "start": 2, "end": 4, "gpu": null,
                    "group": {"members": ["c"], "weights": [2, 1]},
                    "state": "downloading", "done": 3, "needed": 9, "error": null}],
                "predicted_tok_s": 40.0, "measured": {"running": 1, "finished": 3}}])
    );
    assert_eq!(
        s["downloads"],
        json!([{"model": "big", "state": "running", "needed": 100, "done": 25, "file_size": 100,
                "bytes_per_s": 5.0, "eta_s": 15.0, "refused_chunks": 0, "error": null, "node": "a"}])
    );
    assert_eq!(
        s["models"],
        json!([{"id": "big", "online": false, "nodes": [], "layers": null, "bytes": null,
                "context_length": null},
               {"id": "m", "online": true, "nodes": ["a"], "layers": 4, "bytes": 50,
                "context_length": 2048}])
    );
}
