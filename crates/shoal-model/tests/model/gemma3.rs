//! Gemma 3 270M Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0 and F32 tensors; sliding-window and global layers, Q/K
//! norms, post norms, GELU, scaled and tied embeddings) against llama.cpp's golden generations, and split
//! into layer ranges against the whole model.

use crate::common::{check_greedy, check_logprobs, greedy, load_from};
use shoal_model::DecoderStage;
use shoal_testkit::fixtures::gemma_path;

const GOLDEN: &str = "gemma3-270m-q4_k_m.greedy.json";

fn load(ranges: &[(usize, usize)]) -> Vec<DecoderStage> {
    load_from(&gemma_path(), ranges)
}

#[test]
fn greedy_tokens_match_llama_cpp_up_to_the_first_near_tie() {
    check_greedy(&load(&[(0, 18)]), GOLDEN, 24);
}

#[test]
fn logprobs_match_llama_cpp() {
    check_logprobs(&load(&[(0, 18)]), GOLDEN, 0.05, 0.45);
}

#[test]
fn two_stages_give_the_whole_model_s_tokens_and_logits() {
    let whole = load(&[(0, 18)]);
    let split = load(&[(0, 7), (7, 18)]);
    assert!(split[0].is_first() && !split[0].is_last());
    assert!(split[1].is_last() && !split[1].is_first());
    let prompt = [2u32, 818, 5279, 529, 7001, 563];
    let (a_toks, a_logits) = greedy(&whole, &prompt, 8);
    let (b_toks, b_logits) = greedy(&split, &prompt, 8);
    assert_eq!(a_toks, b_toks);
    for (a, b) in a_logits.iter().zip(&b_logits) {
        assert_eq!(
            a, b,
            "f32 hidden states between stages: bitwise the same logits"
        );
    }
}
