//! Drafts from the model's own multi-token-prediction block (`Speculation::Mtp`) on the synthetic
//! glm4moe fixture (shoal-model's `tests/fixtures/synth`: 3 layers and one nextn block, random
//! weights): greedy output is the same token for token as without speculation, alone and with two
//! sequences in one batch, while drafts are proposed and verified; after a rejected draft the block's
//! own cache, cut back and fed again, drafts what a fresh one fed the same sequence drafts; an engine
//! whose model has no nextn block refuses a request asking for "mtp", and so does one started without
//! `mtp` as its default (it never loads the block); the block's KV is paid from the KV budget.

use std::path::PathBuf;

use shoal_engine::draft::DraftSource;
use shoal_engine::engine::{
    EngineConfig, LoadedModel, Placement, load_local_stage, spawn_from_gguf,
};
use shoal_engine::error::EngineError;
use shoal_engine::mtp_draft::MtpDraft;
use shoal_engine::stage::{ChunkSpec, Pool, Stage, StageData};
use shoal_engine::{EngineHandle, GenerateRequest, Prompt, Speculation};
use shoal_model::LayerRange;

mod common;

const MTP: Speculation = Speculation::Mtp { max_draft: 4 };

fn synth(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shoal-model/tests/fixtures/synth")
        .join(name)
}

const GLM: &str = "glm4moe-k-q4_k_m.gguf";

fn engine(file: &str) -> EngineHandle {
    // The server default `mtp` loads the block; requests choose per request.
    let config = EngineConfig {
        threads: 1,
        speculative: MTP,
        ..Default::default()
    };
    spawn_from_gguf(&synth(file), "synth", config).expect("engine")
}

fn request(prompt: &[u32], max_tokens: u32, spec: Speculation) -> GenerateRequest {
    let mut r = common::greedy("synth", Prompt::Tokens(prompt.to_vec()), max_tokens);
    r.ignore_eos = true;
    r.speculative = Some(spec);
    r
}

const PROMPT_A: [u32; 12] = [17, 230, 5, 91, 402, 33, 7, 250, 18, 66, 301, 12];
const PROMPT_B: [u32; 7] = [400, 2, 88, 19, 150, 61, 9];

#[tokio::test]
async fn greedy_output_is_the_same_with_mtp_drafts() {
    let engine = engine(GLM);
    let plain_a = common::ids(&engine, request(&PROMPT_A, 40, Speculation::Off)).await;
    let plain_b = common::ids(&engine, request(&PROMPT_B, 40, Speculation::Off)).await;
    assert_eq!(plain_a.len(), 40);
    let before = engine.stats();
    let drafted = common::ids(&engine, request(&PROMPT_A, 40, MTP)).await;
    let after = engine.stats();
    assert_eq!(drafted, plain_a);
    let passes = after.spec_passes - before.spec_passes;
    let proposed = after.drafted_tokens - before.drafted_tokens;
    assert!(
        passes > 0 && proposed > 0,
        "no draft verified: {passes} passes"
    );
    // Two sequences drafting in the same batches, each with its own nextn cache.
    let (a, b) = tokio::join!(
        common::ids(&engine, request(&PROMPT_A, 40, MTP)),
        common::ids(&engine, request(&PROMPT_B, 40, MTP))
    );
    assert_eq!(a, plain_a);
    assert_eq!(b, plain_b);
}

#[tokio::test]
async fn the_nextn_blocks_kv_is_paid_from_the_engines_kv_budget() {
    let plain = spawn_from_gguf(
        &synth(GLM),
        "synth",
        EngineConfig {
            threads: 1,
            ..Default::default()
        },
    )
    .expect("engine");
    // Without `--speculative mtp` the block is not loaded: a request for it is refused.
    assert!(matches!(
        plain.submit(request(&PROMPT_B, 4, MTP)),
        Err(EngineError::InvalidParam { .. })
    ));
    let (without, with) = (plain.kv_capacity(), engine(GLM).kv_capacity());
    // Three layers' KV a token, and the block's one layer more.
    assert!(
        (with * 4).abs_diff(without * 3) <= 4,
        "{with} tokens with the block, {without} without"
    );
}

#[tokio::test]
async fn a_model_without_a_nextn_block_refuses_mtp() {
    let engine = engine("qwen3moe-k-q4_k_m.gguf");
    match engine.submit(request(&PROMPT_B, 4, MTP)) {
        Err(EngineError::InvalidParam { param, message }) => {
            assert_eq!(param, "speculative");
            assert!(message.contains("multi-token"), "{message}");
        }
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    // The same request without it runs.
    assert_eq!(
        common::ids(&engine, request(&PROMPT_B, 4, Speculation::Off))
            .await
            .len(),
        4
    );
}

/// Feeds `tokens` to `stage` for sequence `seq_id` after what it holds (its hidden rows go to the tap).
fn feed(stage: &mut dyn Stage, seq_id: u64, tokens: &[u32]) {
    let batch = [ChunkSpec {
        seq_id,
        len: tokens.len(),
        want_logits: true,
        pool: Pool::None,
    }];
    shoal_engine::stage::forward(stage, &batch, StageData::Tokens(tokens.to_vec()), &[])
        .expect("forward");
}

#[test]
fn the_nextn_cache_rewinds_with_a_rejected_draft() {
    let pool = std::sync::Arc::new(shoal_kernels::ThreadPool::new(1));
    let mut plain = load_local_stage(&synth(GLM), LayerRange::full(3), &pool).expect("stage");
    assert!(plain.mtp().is_none(), "a hosted stage leaves the block out");
    let placement = Placement::cpu().with_nextn(true);
    let loaded =
        LoadedModel::from_gguf_on(&synth(GLM), "synth", None, &pool, placement).expect("model");
    let mut stages = loaded.stages;
    let stage = stages[0].as_mut();
    let mtp = stage
        .mtp()
        .expect("the fixture's last stage has the nextn block");
    let p = PROMPT_A.to_vec();
    // Sequence 1: the prompt, then its next token `a` is known and three tokens are drafted.
    let mut first = MtpDraft::new(1, mtp.clone());
    // Before a pass computed the prompt's rows nothing is drafted (a draft from zero rows is wasted).
    assert!(first.propose(&p, 3).is_empty());
    assert_eq!(first.cached(), 0);
    feed(stage, 1, &p);
    let a = 44;
    let mut seq = [p.clone(), vec![a]].concat();
    let draft = first.propose(&seq, 3);
    assert_eq!(draft.len(), 3);
    assert_eq!(
        first.cached(),
        p.len(),
        "chained entries are cut after drafting"
    );
    // The pass verifying them: `a` and the drafts; the first drafted token is accepted, the second
    // is not (another token is picked): the stage keeps `p, a, d1`.
    feed(stage, 1, &[[a].as_slice(), &draft].concat());
    stage
        .kv(shoal_engine::stage::KvOp::Rewind {
            seq_id: 1,
            len: p.len() + 2,
        })
        .expect("rewind");
    let picked = (draft[1] + 1) % 500;
    seq.extend([draft[0], picked]);
    let again = first.propose(&seq, 3);
    // Sequence 2 computes the same tokens from scratch.
    let mut fresh = MtpDraft::new(2, mtp.clone());
    feed(stage, 2, &seq[..seq.len() - 1]);
    let fresh_draft = fresh.propose(&seq, 3);
    assert_eq!(again, fresh_draft);
    assert_eq!(first.cached(), seq.len() - 1);
    assert_eq!(fresh.cached(), seq.len() - 1);
    // A dropped draft source leaves the tap.
    drop(first);
    assert!(!mtp.tap.wants(1) && mtp.tap.wants(2));
}
