//! The multi-token-prediction (`nextn`) block of the synthetic glm4moe fixture (one nextn layer after
//! its 3): a whole last stage loads it when asked (a plain load leaves it out) and the main pass is unchanged by it (the llama.cpp comparison
//! in `synthetic` still holds); a first-only stage, and files without the block, have none; the
//! footprint prices its bytes on the last stage; the block's KV cache steps like any layer's — several
//! positions in one call give the rows of one call per position, and cutting its cache back and
//! feeding again gives the same logits (what a rejected draft's rewind relies on).

use std::path::PathBuf;
use std::sync::Arc;

use shoal_kernels::ThreadPool;
use shoal_model::decoder::nextn::nextn_bytes;
use shoal_model::gguf::GgufFile;
use shoal_model::{DecoderStage, Footprint, LayerRange, ModelConfig, Pool, SeqChunk, StageInput};

fn synth(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/synth")
        .join(name)
}

const GLM: &str = "glm4moe-k-q4_k_m.gguf";

fn stage(name: &str, range: Option<LayerRange>) -> DecoderStage {
    let pool = Arc::new(ThreadPool::new(1));
    let mut g = GgufFile::open(&synth(name)).expect("open");
    let n = ModelConfig::from_gguf(&g).expect("config").n_layers;
    let mut stage =
        DecoderStage::load(&mut g, range.unwrap_or(LayerRange::full(n)), &pool).expect("load");
    stage.load_nextn(&mut g).expect("nextn");
    stage
}

/// The final-normed hidden rows of `tokens` through the whole model.
fn hidden_rows(model: &DecoderStage, tokens: &[u32]) -> Vec<f32> {
    let mut kv = model.new_kv_cache();
    let mut chunk = [SeqChunk {
        kv: &mut kv,
        len: tokens.len(),
        want_logits: true,
        pool: Pool::None,
    }];
    let mut hidden = Vec::new();
    model
        .run_keeping_hidden(StageInput::Tokens(tokens), &mut chunk, None, &mut hidden)
        .expect("run");
    hidden
}

#[test]
fn a_whole_last_stage_loads_the_nextn_block_and_the_footprint_prices_it() {
    let whole = stage(GLM, None);
    let nextn = whole
        .nextn()
        .expect("the glm4moe fixture has a nextn block");
    assert_eq!(nextn.layer(), 3, "block 3, after the model's 3 layers");
    // Only on request: a plain load (a node that does not draft with it) leaves it out.
    let pool = Arc::new(ThreadPool::new(1));
    let mut g = GgufFile::open(&synth(GLM)).expect("open");
    let plain = DecoderStage::load(&mut g, LayerRange::full(3), &pool).expect("load");
    assert!(plain.nextn().is_none());
    assert!(
        stage(GLM, Some(LayerRange { start: 0, end: 1 }))
            .nextn()
            .is_none()
    );
    assert!(
        stage(GLM, Some(LayerRange { start: 1, end: 3 }))
            .nextn()
            .is_some()
    );
    assert!(stage("qwen3moe-k-q4_k_m.gguf", None).nextn().is_none());

    let g = GgufFile::open(&synth(GLM)).expect("open");
    let cfg = ModelConfig::from_gguf(&g).expect("config");
    let block: u64 = g
        .tensor_names()
        .filter(|n| n.starts_with("blk.3."))
        .map(|n| g.tensor_bytes(n).expect("bytes"))
        .sum();
    let embed = g.tensor_bytes("token_embd.weight").expect("embedding");
    // The block has neither embed_tokens nor shared_head_head: the stage holds a copy of the
    // embedding (the file is untied) and shares the model's head.
    assert_eq!(nextn_bytes(&g, &cfg), block + embed);
    let fp = Footprint::from_gguf(&g).expect("footprint");
    let head = g.tensor_bytes("output.weight").expect("output")
        + g.tensor_bytes("output_norm.weight").expect("norm");
    assert_eq!(fp.head_bytes, head + block + embed);
    // A token's decode reads the head, not the block the main pass never runs.
    assert_eq!(fp.active_head_bytes, head);
    // A node that does not load the block holds the head alone.
    let without = fp.without_nextn();
    assert_eq!((without.head_bytes, without.active_head_bytes), (head, 0));
    let qwen = GgufFile::open(&synth("qwen3moe-k-q4_k_m.gguf")).expect("open");
    let qcfg = ModelConfig::from_gguf(&qwen).expect("config");
    assert_eq!(nextn_bytes(&qwen, &qcfg), 0);
}

#[test]
fn the_nextn_block_steps_like_a_layer_and_its_cache_rewinds() {
    let model = stage(GLM, None);
    let nextn = model.nextn().expect("nextn").clone();
    let dim = nextn.dim();
    let tokens: Vec<u32> = vec![5, 77, 300, 12, 9, 41, 250, 3, 18];
    let hidden = hidden_rows(&model, &tokens);
    assert_eq!(hidden.len(), tokens.len() * dim);
    let n = tokens.len() - 1;
    // Position i combines hidden row i with token i + 1.
    let mut all = nextn.new_kv_cache();
    let once = nextn
        .forward(&mut all, &tokens[1..], &hidden[..n * dim])
        .expect("forward");
    assert_eq!(all.len(), n);
    assert_eq!(once.hidden.len(), n * dim);
    let mut one = nextn.new_kv_cache();
    let mut last = None;
    for p in 0..n {
        let out = nextn
            .forward(
                &mut one,
                &tokens[p + 1..p + 2],
                &hidden[p * dim..(p + 1) * dim],
            )
            .expect("step");
        let want = &once.hidden[p * dim..(p + 1) * dim];
        let diff = out
            .hidden
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-3, "position {p}: {diff}");
        last = Some(out);
    }
    let last = last.expect("steps");
    let top = |l: &[f32]| {
        l.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
    };
    assert_eq!(top(&last.logits), top(&once.logits));
    assert!(once.logits.iter().all(|v| v.is_finite()));
    // A chained draft step, then the cut back: fed again, the last position gives the same logits.
    let h = once.carried.clone();
    let drafted = top(&once.logits).expect("a token") as u32;
    let chained = nextn.forward(&mut all, &[drafted], &h).expect("chain");
    assert_eq!(all.len(), n + 1);
    assert_ne!(chained.logits, once.logits);
    all.truncate(n - 1);
    let again = nextn
        .forward(&mut all, &tokens[n..n + 1], &hidden[(n - 1) * dim..n * dim])
        .expect("again");
    assert_eq!(all.len(), n);
    assert_eq!(again.logits, last.logits);
    // Rows that do not match the tokens are refused.
    assert!(
        nextn
            .forward(&mut all, &tokens[1..3], &hidden[..dim])
            .is_err()
    );
}
