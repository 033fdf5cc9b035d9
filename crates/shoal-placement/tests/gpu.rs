//! A node's GPU in the planner: a device with its own memory and measured speed. A stage on a node
//! with a GPU faster than its CPU puts its first layers there (as many as the GPU's memory holds),
//! the rest on the CPU, and is priced as the sum; a slower GPU takes none; a cluster of a GPU node
//! and two CPU nodes puts the model where it runs fastest.

mod common;

use common::{GB, card, link, node};
use shoal_placement::{
    Constraints, GpuInfo, GpuLayers, LinkKind, NodeInfo, Stage, Topology, best, forecast_at,
    predict,
};

/// A GPU of `mem_gb` GB decoding `speed` layer-steps/s, index 0, used when faster.
fn gpu(mem_gb: u64, speed: f64) -> GpuInfo {
    GpuInfo {
        index: 0,
        mem_available: mem_gb * GB,
        speed,
        prefill_speed: None,
        head_us: None,
        attention_us: None,
        always: false,
    }
}

fn with_gpu(mut n: NodeInfo, g: GpuInfo) -> NodeInfo {
    n.gpu = Some(g);
    n
}

fn alone(n: NodeInfo) -> Topology {
    Topology {
        nodes: vec![n],
        links: vec![],
    }
}

#[test]
fn a_gpu_faster_than_the_cpu_takes_as_many_layers_as_its_memory_holds() {
    // 30 layers of 1 GB; a 12 GB GPU at 10× the CPU's speed holds 12 of them.
    let topo = alone(with_gpu(node("box", 64, 100.0), gpu(12, 1000.0)));
    let p = best(&topo, &card(), &Constraints::default()).unwrap();
    assert_eq!(p.stages.len(), 1);
    assert_eq!(
        p.stages[0].gpu,
        Some(GpuLayers {
            index: 0,
            layers: 12
        })
    );
    // 12 layers at 1 ms + 18 at 10 ms.
    let want = 12.0 * 1e3 + 18.0 * 1e4;
    assert!(
        (p.predicted_token_latency_us - want).abs() < 1e-6,
        "{} vs {want}",
        p.predicted_token_latency_us
    );
    // A GPU that holds the whole model takes every layer.
    let topo = alone(with_gpu(node("box", 64, 100.0), gpu(80, 1000.0)));
    let p = best(&topo, &card(), &Constraints::default()).unwrap();
    assert_eq!(p.stages[0].gpu_layers(), 30);
    assert!((p.predicted_token_latency_us - 30.0 * 1e3).abs() < 1e-6);
}

#[test]
fn a_gpu_slower_than_the_cpu_takes_no_layer_unless_the_node_names_it() {
    let slow = gpu(80, 50.0);
    let topo = alone(with_gpu(node("box", 64, 100.0), slow.clone()));
    let p = best(&topo, &card(), &Constraints::default()).unwrap();
    assert_eq!(p.stages[0].gpu, None);
    assert!((p.predicted_token_latency_us - 30.0 * 1e4).abs() < 1e-6);
    // `--device gpu`: the node names its GPU, which then takes every layer that fits, however slow.
    let named = GpuInfo {
        always: true,
        ..slow
    };
    let topo = alone(with_gpu(node("box", 64, 100.0), named));
    let p = best(&topo, &card(), &Constraints::default()).unwrap();
    assert_eq!(p.stages[0].gpu_layers(), 30);
    assert!((p.predicted_token_latency_us - 30.0 * 2e4).abs() < 1e-6);
}

#[test]
fn a_model_bigger_than_the_gpu_splits_gpu_and_cpu_on_one_node_priced_as_the_sum() {
    // The host alone holds 20 GB: the model (30 GB) fits only with the GPU's 16 layers.
    let host_only = alone(node("box", 20, 100.0));
    assert!(best(&host_only, &card(), &Constraints::default()).is_err());
    let mut n = with_gpu(node("box", 20, 100.0), gpu(16, 400.0));
    n.attention_us = Some(0.01);
    n.gpu.as_mut().unwrap().attention_us = Some(0.001);
    let topo = alone(n);
    let constraints = Constraints {
        context_tokens: Some(1000),
        ..Constraints::default()
    };
    let p = best(&topo, &card(), &constraints).unwrap();
    assert_eq!(p.stages[0].gpu_layers(), 16);
    // 16 GPU layers at (2500 + 1000 · 0.001) µs + 14 CPU layers at (10 000 + 1000 · 0.01) µs.
    let want = 16.0 * (2500.0 + 1.0) + 14.0 * (10_000.0 + 10.0);
    let got = p.prediction.token_latency_us;
    assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    assert!(
        (p.prediction.stages[0].attention_us - 1000.0 * (16.0 * 0.001 + 14.0 * 0.01)).abs() < 1e-9
    );
    // The same stage record forecasts (and predicts) the same; without its GPU part, all CPU.
    let (goal, prompt) = (p.prediction.goal, p.prediction.prompt_tokens);
    let f = forecast_at(&topo, &card(), &p.stages, goal, prompt, 1000).unwrap();
    assert!((f.token_latency_us - p.prediction.token_latency_us).abs() < 1e-6);
    let cpu_only = [Stage::cpu("box".parse().unwrap(), 0, 30)];
    let c = predict(&topo, &card(), &cpu_only).unwrap();
    let at_default = predict(&topo, &card(), &p.stages).unwrap();
    assert!(c.total_us > at_default.total_us);
}

#[test]
fn a_gpu_node_beats_two_cpu_nodes() {
    // Two laptops that together hold the model, and a box whose GPU (8× its CPU) holds 24 layers.
    let topo = Topology {
        nodes: vec![
            node("laptop1", 20, 150.0),
            node("laptop2", 20, 150.0),
            with_gpu(node("box", 16, 100.0), gpu(24, 800.0)),
        ],
        links: vec![
            link("laptop1", "laptop2", LinkKind::Wifi),
            link("laptop1", "box", LinkKind::Ethernet),
            link("laptop2", "box", LinkKind::Ethernet),
        ],
    };
    let p = best(&topo, &card(), &Constraints::default()).unwrap();
    let gpu_stage = p
        .stages
        .iter()
        .find(|s| s.node == "box")
        .expect("the GPU node is used");
    assert_eq!(gpu_stage.gpu_layers(), 24, "{:?}", p.stages);
    // Every layer goes where it runs fastest: 24 on the box's GPU, and the 6 its GPU cannot hold on
    // a laptop, whose CPU is faster than the box's (one hop over ethernet costs less than the gain).
    assert_eq!(
        p.stages,
        [
            Stage {
                gpu: Some(GpuLayers {
                    index: 0,
                    layers: 24
                }),
                ..Stage::cpu("box".parse().unwrap(), 0, 24)
            },
            Stage::cpu("laptop1".parse().unwrap(), 24, 30)
        ]
    );
    let laptops = [
        Stage::cpu("laptop1".parse().unwrap(), 0, 15),
        Stage::cpu("laptop2".parse().unwrap(), 15, 30),
    ];
    let box_alone = [Stage {
        gpu: gpu_stage.gpu,
        ..Stage::cpu("box".parse().unwrap(), 0, 30)
    }];
    for other in [&laptops[..], &box_alone[..]] {
        let t = predict(&topo, &card(), other).unwrap().total_us;
        assert!(p.predicted_token_latency_us < t, "{other:?}: {t}");
    }
    // With a box CPU as fast as the laptops', the box alone wins (no hop to pay).
    let mut topo = topo;
    topo.nodes[2].speed = 150.0;
    let p = best(&topo, &card(), &Constraints::default()).unwrap();
    assert_eq!(p.stages.len(), 1, "{:?}", p.stages);
    assert_eq!(
        (p.stages[0].node.as_str(), p.stages[0].gpu_layers()),
        ("box", 24)
    );
}

#[test]
fn records_without_a_gpu_field_read_as_all_cpu_and_cpu_records_write_none() {
    let old: Stage = serde_json::from_str(r#"{"node":"a","start":0,"end":5}"#).unwrap();
    assert_eq!((old.gpu, old.gpu_layers()), (None, 0));
    assert_eq!(
        serde_json::to_string(&old).unwrap(),
        r#"{"node":"a","start":0,"end":5}"#
    );
    let split = Stage {
        gpu: Some(GpuLayers {
            index: 1,
            layers: 3,
        }),
        ..old
    };
    let json = serde_json::to_string(&split).unwrap();
    assert!(json.contains(r#""gpu":{"index":1,"layers":3}"#), "{json}");
    let n: NodeInfo = serde_json::from_str(r#"{"id":"a","mem_available":1,"speed":1.0}"#).unwrap();
    assert!(n.gpu.is_none());
}
