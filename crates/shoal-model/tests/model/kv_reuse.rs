//! Reused KV buffers are never read beyond what the sequence wrote: a cache built on buffers full of
//! NaN, or on the buffers another sequence left, computes bit-for-bit what a fresh cache computes
//! (SmolLM2, chunked prefill then decode steps, whole model and split stages).

use std::sync::{Arc, Mutex};

use crate::common::{argmax, load_from, step};
use half::f16;
use shoal_model::kv::{KvBuf, KvSpares};
use shoal_model::{DecoderStage, KvBuffers, KvCache};
use shoal_testkit::fixtures::model_path;

/// Hands out buffers twice as long as asked, full of NaN, and drops what it gets back.
struct Poisoned;

impl KvBuffers for Poisoned {
    fn take(&self, len: usize) -> Option<KvBuf> {
        Some(vec![f16::NAN; 2 * len])
    }
    fn give(&self, _buf: KvBuf) {}
}

/// Keeps what it gets back for the next cache.
#[derive(Default)]
struct Kept(Mutex<KvSpares>);

impl KvBuffers for Kept {
    fn take(&self, len: usize) -> Option<KvBuf> {
        self.0.lock().unwrap().take(len)
    }
    fn give(&self, buf: KvBuf) {
        self.0.lock().unwrap().put(buf);
    }
}

/// Every logit of a prompt prefilled in two chunks and then 40 greedy decode steps (past the first
/// growth of a fresh cache).
fn run(
    stages: &[DecoderStage],
    buffers: Option<Arc<dyn KvBuffers>>,
    prompt: &[u32],
) -> Vec<Vec<f32>> {
    let mut kvs: Vec<KvCache> = stages
        .iter()
        .map(|s| {
            let c = s.config();
            KvCache::with_buffers(s.range().len(), c.n_kv_heads, c.head_dim, buffers.clone())
        })
        .collect();
    let (a, b) = prompt.split_at(prompt.len() / 2);
    step(stages, &mut kvs, a);
    let mut out = vec![step(stages, &mut kvs, b)];
    for _ in 0..40 {
        let next = argmax(out.last().expect("logits"));
        out.push(step(stages, &mut kvs, &[next]));
    }
    out
}

fn bits(logits: &[Vec<f32>]) -> Vec<Vec<u32>> {
    logits
        .iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn reused_kv_buffers_give_bit_identical_logits() {
    let prompt: Vec<u32> = (0..37).map(|i| 300 + (i * 97) % 4000).collect();
    let other: Vec<u32> = (0..61).map(|i| 1000 + (i * 31) % 3000).collect();
    for ranges in [&[(0, 30)][..], &[(0, 12), (12, 30)][..]] {
        let stages = load_from(&model_path(), ranges);
        let fresh = bits(&run(&stages, None, &prompt));
        assert!(
            fresh
                .iter()
                .flatten()
                .all(|&b| f32::from_bits(b).is_finite())
        );
        let poisoned = bits(&run(&stages, Some(Arc::new(Poisoned)), &prompt));
        assert!(
            fresh == poisoned,
            "{ranges:?}: NaN-filled buffers changed the logits"
        );
        // Buffers another (longer) sequence wrote, then given back.
        let kept: Arc<dyn KvBuffers> = Arc::new(Kept::default());
        run(&stages, Some(kept.clone()), &other);
        let reused = bits(&run(&stages, Some(kept), &prompt));
        assert!(
            fresh == reused,
            "{ranges:?}: another sequence's old KV changed the logits"
        );
    }
}
