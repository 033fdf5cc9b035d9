//! The cost model's inputs in [`Footprint`]: the weight type holding most of the layers' bytes and
//! the parameters of one layer's matrices, checked against the dims each synthetic fixture was made
//! with (`tests/fixtures/synth/manifest.json`) and against the real models' known shapes.

use std::path::PathBuf;

use shoal_model::Footprint;
use shoal_model::gguf::GgufFile;

fn footprint(path: &std::path::Path) -> Footprint {
    let gguf = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Footprint::from_gguf(&gguf).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Matrix weights of one layer from its dims: Q and O (`n_embd × n_head·head_dim` each), K and V
/// (`n_embd × n_kv·head_dim` each), gate, up and down (`n_embd × n_ff` each); with `experts`, the
/// router (`count × n_embd`), every routed expert's gate, up and down (`n_embd × ff` each) and the
/// shared expert's (`n_embd × shared_ff` each) instead. Returns (all, what one token multiplies by).
fn params_of(
    d: &serde_json::Value,
    experts: &serde_json::Value,
    mla: &serde_json::Value,
) -> (u64, u64) {
    let n = |k: &str| d[k].as_u64().unwrap_or_else(|| panic!("dims.{k}"));
    let (embd, q, kv, ff) = (
        n("n_embd"),
        n("n_head") * n("head_dim"),
        n("n_kv") * n("head_dim"),
        n("n_ff"),
    );
    let attn = match mla.is_null() {
        true => 2 * embd * q + 2 * embd * kv,
        false => {
            // Latent attention: q_a, q_b, kv_a (latent + rope), per head k_b and v_b, the output.
            let m = |k: &str| mla[k].as_u64().unwrap_or_else(|| panic!("mla.{k}"));
            let (nh, kv_lora, v_head) = (n("n_head"), m("kv_lora"), m("v_head"));
            // Queries through the bottleneck (q_a, q_b), or straight from attn_q (q_lora 0).
            let q = match m("q_lora") {
                0 => embd * nh * (m("nope") + m("rope")),
                r => embd * r + r * nh * (m("nope") + m("rope")),
            };
            q + embd * (kv_lora + m("rope"))
                + nh * kv_lora * (m("nope") + v_head)
                + embd * nh * v_head
        }
    };
    if experts.is_null() {
        return (attn + 3 * embd * ff, attn + 3 * embd * ff);
    }
    let e = |k: &str| experts[k].as_u64().unwrap_or_else(|| panic!("experts.{k}"));
    let fixed = attn + e("count") * embd + 3 * embd * e("shared_ff");
    let expert = 3 * embd * e("ff");
    (fixed + e("count") * expert, fixed + e("used") * expert)
}

#[test]
fn synthetic_models_name_their_weight_type_and_layer_params() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/synth");
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("manifest");
    let manifest: serde_json::Value = serde_json::from_str(&text).expect("manifest json");
    let fixtures = manifest["fixtures"].as_array().expect("fixtures");
    assert!(fixtures.len() >= 12, "only {} fixtures", fixtures.len());
    for f in fixtures {
        let name = f["name"].as_str().expect("name");
        let fp = footprint(&dir.join(f["file"].as_str().expect("file")));
        // "Q4_K_M" files hold mostly Q4_K (Q6_K for a few matrices); "MXFP4_MOE" mostly MXFP4
        // (the experts; Q8_0 for the rest).
        let ftype = f["ftype"].as_str().expect("ftype");
        let want = ftype.strip_suffix("_M").unwrap_or(ftype);
        let want = want.strip_suffix("_MOE").unwrap_or(want);
        assert_eq!(fp.weight_type, want, "{name}");
        let (all, active) = params_of(&f["dims"], &f["experts"], &f["mla"]);
        assert_eq!(fp.layer_params, all, "{name}");
        assert_eq!(fp.active_layer_params, active, "{name}");
        // KV per token and layer: a key and a value per KV head, or under latent attention the latent
        // and the rope part once (f16).
        let d = &f["dims"];
        let kv_values = match f["mla"].is_null() {
            true => 2 * d["n_kv"].as_u64().unwrap() * d["head_dim"].as_u64().unwrap(),
            false => f["mla"]["kv_lora"].as_u64().unwrap() + f["mla"]["rope"].as_u64().unwrap(),
        };
        assert_eq!(fp.kv_bytes_per_token_per_layer, 2 * kv_values, "{name}");
        assert_eq!(
            fp.active_layer_bytes < fp.layer_bytes,
            all > active,
            "{name}"
        );
    }
}

#[test]
fn real_models_name_their_weight_type_and_layer_params() {
    // SmolLM2-135M: 576 wide, 9 query heads and 3 KV heads of 64, FFN 1536; every matrix Q4_1.
    let smol = footprint(&shoal_testkit::fixtures::model_path());
    assert_eq!(smol.weight_type, "Q4_1");
    let (d, kv, ff) = (576u64, 3 * 64u64, 1536u64);
    assert_eq!(smol.layer_params, 2 * d * d + 2 * d * kv + 3 * d * ff);
    // The head is the tied Q8_0 embedding matrix, 49,152 × 576; 9 query heads of 64 attend.
    assert_eq!((smol.head_type, smol.vocab_size), ("Q8_0", 49_152));
    assert_eq!(smol.head_params, 49_152 * d);
    assert_eq!(smol.attention_flops_per_position, 4 * 9 * 64);
    // Gemma 3 270M "Q4_K_M": rows of 640 values are not whole K-quant super-blocks, so llama.cpp
    // stored the matrices reading the 640-wide hidden state (most layer bytes) as Q5_0.
    let gemma = footprint(&shoal_testkit::fixtures::gemma_path());
    assert_eq!(gemma.weight_type, "Q5_0");
    // 640 wide, 4 query heads and 1 KV head of 256, FFN 2048.
    let (d, q, kv, ff) = (640u64, 4 * 256u64, 256u64, 2048u64);
    assert_eq!(gemma.layer_params, 2 * d * q + 2 * d * kv + 3 * d * ff);
}
