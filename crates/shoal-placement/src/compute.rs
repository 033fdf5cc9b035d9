//! What one model costs on one node's devices, term by term ([`Compute`]; [`Split`] for a stage whose
//! first layers run on the node's GPU): a layer's weights at the roofline of its decode and batched
//! rates, attention over the cached context, the output head and sampling on a last stage. `cost`
//! (one stream), `group` (a tensor-parallel stage) and `rates` (batches, prompts) build on these.

use crate::model::{ModelCard, NodeInfo};

/// What one model costs on one node, per term of [`Compute::stage_us`] (microseconds):
/// - a layer's weights: the roofline `max(1/speed, tokens/max(prefill_speed, speed))` (one token costs
///   exactly its measured decode step: the batched rate never makes a lone token compute-bound), or
///   `tokens/speed` (every token a full step) when the compute-bound rate was not measured (or is not a
///   finite positive number);
/// - attention: `attention_us` per layer per cached position each token reads (0 when not measured);
/// - on the last stage, the output head: its weights streamed once (`head_us`, or `head_bytes /
///   read_layer_bytes` layers at `speed` when not measured), or `2 · head_params` flops per token at the node's
///   batched rate when a batch makes that larger; and sampling, `sample_us` per sampled token (0 when not
///   measured).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Compute {
    speed: f64,
    prefill_speed: Option<f64>,
    attention_us: f64,
    /// The head's weights streamed once.
    head_stream_us: f64,
    /// The head's products for one token when compute-bound; `None`: each token streams it again.
    head_token_us: Option<f64>,
    sample_us: f64,
}

/// `v` when it is a finite number `>= 0`.
fn usable(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite() && *x >= 0.0)
}

impl Compute {
    pub fn of(node: &NodeInfo, card: &ModelCard) -> Self {
        // A batch is never slower per token than its tokens decoded one at a time: the decode rate was
        // measured on the decode kernel, its arithmetic included, while the batched rate comes from
        // one format's batched kernel (a slower format's, on some CPUs, than the model's own).
        let prefill_speed = node
            .prefill_speed
            .filter(|p| p.is_finite() && *p > 0.0)
            .map(|p| p.max(node.speed));
        let ratio = |a: u64, b: u64| {
            if a > 0 && b > 0 {
                a as f64 / b as f64
            } else {
                0.0
            }
        };
        // The head in layers: by bytes for streaming, by parameters (else bytes) for flops.
        // (A layer here is what a token reads of it: the active experts of a mixture-of-experts one.)
        let head_layers = ratio(card.read_head_bytes(), card.read_layer_bytes());
        let head_flop_layers = match ratio(card.head_params, card.read_layer_params()) {
            0.0 => head_layers,
            r => r,
        };
        Compute {
            speed: node.speed,
            prefill_speed,
            attention_us: usable(node.attention_us).unwrap_or(0.0),
            head_stream_us: usable(node.head_us).unwrap_or(head_layers * 1e6 / node.speed),
            head_token_us: prefill_speed.map(|p| head_flop_layers * 1e6 / p),
            sample_us: usable(node.sample_us).unwrap_or(0.0),
        }
    }

    /// One layer's weights for a batch of `tokens` tokens (the roofline).
    pub fn layer_us(self, tokens: usize) -> f64 {
        let step = 1e6 / self.speed;
        match self.prefill_speed {
            Some(p) => step.max(tokens as f64 * 1e6 / p),
            None => tokens as f64 * step,
        }
    }

    /// One layer of a decode step of `tokens` tokens, each attending over `context` cached positions.
    pub fn decode_layer_us(self, tokens: usize, context: usize) -> f64 {
        self.layer_us(tokens) + (tokens * context) as f64 * self.attention_us
    }

    /// Sampling `sampled` rows (the sampler's pass over a vocabulary each).
    pub fn sampling_us(self, sampled: usize) -> f64 {
        sampled as f64 * self.sample_us
    }

    /// The output head for `tokens` rows, `sampled` of them sampled.
    pub fn head_us(self, tokens: usize, sampled: usize) -> f64 {
        let t = tokens as f64;
        let products = match self.head_token_us {
            Some(c) => self.head_stream_us.max(t * c),
            None => t * self.head_stream_us,
        };
        products + sampled as f64 * self.sample_us
    }

    /// A stage of `layers` layers for a decode step of `tokens` tokens at `context` (the head and
    /// sampling too when it is the `last` stage).
    pub fn stage_us(self, layers: usize, tokens: usize, context: usize, last: bool) -> f64 {
        let head = if last {
            self.head_us(tokens, tokens)
        } else {
            0.0
        };
        layers as f64 * self.decode_layer_us(tokens, context) + head
    }

    /// A stage of `layers` layers for a prompt chunk of `tokens` tokens after `offset` earlier ones
    /// (each attends over the positions before it and itself); with `sample` (the last stage, the
    /// prompt's last chunk) the head and sampling for the chunk's last row.
    pub fn chunk_us(self, layers: usize, offset: usize, tokens: usize, sample: bool) -> f64 {
        let (p, c) = (offset as f64, tokens as f64);
        let positions = c * p + c * (c + 1.0) / 2.0;
        let head = if sample { self.head_us(1, 1) } else { 0.0 };
        layers as f64 * (self.layer_us(tokens) + positions * self.attention_us) + head
    }

    /// What one more cached position adds to one token's time on a stage of `layers` layers.
    pub fn attention_per_position_us(self, layers: usize) -> f64 {
        layers as f64 * self.attention_us
    }
}

/// What one stage costs on its node when its first `gpu_layers` layers run on the node's GPU and the
/// rest on its CPU: the sum of the two parts, each at its own device's [`Compute`]; the head and
/// sampling on the GPU's part only when it holds every layer of a last stage.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Split {
    cpu: Compute,
    /// The GPU's compute and the layers a stage puts there at most.
    gpu: Option<(Compute, usize)>,
}

impl Split {
    /// `node` for the model of `card`, its first `gpu_layers` layers on its GPU (none when the node
    /// uses no GPU).
    pub fn of(node: &NodeInfo, card: &ModelCard, gpu_layers: usize) -> Self {
        let gpu = node
            .gpu_node()
            .filter(|_| gpu_layers > 0)
            .map(|g| (Compute::of(&g, card), gpu_layers));
        Split {
            cpu: Compute::of(node, card),
            gpu,
        }
    }

    /// The GPU's compute and the layers it takes of a stage of `layers`, when it takes any.
    fn gpu_part(self, layers: usize) -> Option<(Compute, usize)> {
        self.gpu
            .map(|(c, k)| (c, k.min(layers)))
            .filter(|p| p.1 > 0)
    }

    /// [`Compute::stage_us`] of both parts.
    pub fn stage_us(self, layers: usize, tokens: usize, context: usize, last: bool) -> f64 {
        match self.gpu_part(layers) {
            None => self.cpu.stage_us(layers, tokens, context, last),
            Some((g, k)) if k == layers => g.stage_us(k, tokens, context, last),
            Some((g, k)) => {
                g.stage_us(k, tokens, context, false)
                    + self.cpu.stage_us(layers - k, tokens, context, last)
            }
        }
    }

    /// [`Compute::chunk_us`] of both parts.
    pub fn chunk_us(self, layers: usize, offset: usize, tokens: usize, sample: bool) -> f64 {
        match self.gpu_part(layers) {
            None => self.cpu.chunk_us(layers, offset, tokens, sample),
            Some((g, k)) if k == layers => g.chunk_us(k, offset, tokens, sample),
            Some((g, k)) => {
                g.chunk_us(k, offset, tokens, false)
                    + self.cpu.chunk_us(layers - k, offset, tokens, sample)
            }
        }
    }

    /// [`Compute::head_us`] on the part that holds the head of a last stage of `layers` layers.
    pub fn head_us(self, layers: usize, tokens: usize, sampled: usize) -> f64 {
        match self.gpu_part(layers) {
            Some((g, k)) if k == layers => g.head_us(tokens, sampled),
            _ => self.cpu.head_us(tokens, sampled),
        }
    }

    /// [`Compute::attention_per_position_us`] of both parts.
    pub fn attention_per_position_us(self, layers: usize) -> f64 {
        match self.gpu_part(layers) {
            None => self.cpu.attention_per_position_us(layers),
            Some((g, k)) => {
                g.attention_per_position_us(k) + self.cpu.attention_per_position_us(layers - k)
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn card() -> ModelCard {
        crate::split::tests::card(10, 100)
    }

    /// A node of 1 GiB with a decode speed and nothing else measured.
    pub(crate) fn node(id: &str, speed: f64) -> NodeInfo {
        NodeInfo {
            id: id.parse().unwrap(),
            mem_available: 1 << 30,
            speed,
            prefill_speed: None,
            head_us: None,
            attention_us: None,
            sample_us: None,
            gpu: None,
            machine: None,
        }
    }
    #[test]
    fn a_batch_costs_its_roofline() {
        let mut n = node("a", 1000.0);
        let layer_us = |n: &NodeInfo, t| Compute::of(n, &card()).layer_us(t);
        assert!((layer_us(&n, 1) - 1000.0).abs() < 1e-9);
        assert!(
            (layer_us(&n, 8) - 8000.0).abs() < 1e-9,
            "unmeasured: b× one token"
        );
        n.prefill_speed = Some(4000.0);
        assert!((layer_us(&n, 1) - 1000.0).abs() < 1e-9, "memory-bound");
        assert!((layer_us(&n, 4) - 1000.0).abs() < 1e-9);
        assert!((layer_us(&n, 16) - 4000.0).abs() < 1e-9, "compute-bound");
        // A batched rate below the decode rate (measured on a slower format's batched kernel): one
        // token is its decode step, a batch no slower than its tokens one at a time.
        n.prefill_speed = Some(500.0);
        assert!(
            (layer_us(&n, 1) - 1000.0).abs() < 1e-9,
            "one token: its decode step"
        );
        assert!(
            (layer_us(&n, 4) - 4000.0).abs() < 1e-9,
            "b tokens: b steps at most"
        );
    }

    /// The last stage pays the head (streamed at its measured time, or as `head_bytes / layer_bytes`
    /// layers when not measured) and sampling; every layer pays attention over the context.
    #[test]
    fn the_last_stage_pays_the_head_and_every_layer_its_attention() {
        let mut c = card();
        c.head_bytes = 300; // three layers' worth (layer_bytes 100)
        c.layer_params = 1000;
        c.head_params = 5000;
        let mut n = node("a", 1000.0);
        let us =
            |n: &NodeInfo, tokens, ctx, last| Compute::of(n, &c).stage_us(2, tokens, ctx, last);
        assert!(
            (us(&n, 1, 100, false) - 2000.0).abs() < 1e-9,
            "nothing measured"
        );
        assert!(
            (us(&n, 1, 100, true) - 5000.0).abs() < 1e-9,
            "the head as 3 layers"
        );
        // A block the main pass never runs (an MTP layer) is held there but not read per token.
        let held = ModelCard {
            head_bytes: 1300,
            active_head_bytes: 300,
            ..c.clone()
        };
        let last = Compute::of(&n, &held).stage_us(2, 1, 100, true);
        assert!((last - 5000.0).abs() < 1e-9, "{last}");
        assert_eq!(held.stage_bytes(2, false, true, 0), 200 + 1300);
        n.head_us = Some(700.0);
        n.sample_us = Some(50.0);
        n.attention_us = Some(0.5);
        // 2 layers · (1000 + 100 positions · 0.5) + head 700 + sample 50.
        assert!((us(&n, 1, 100, true) - 2850.0).abs() < 1e-9);
        assert!((us(&n, 1, 100, false) - 2100.0).abs() < 1e-9);
        // A batch of 4 without a batched rate: every token streams everything again.
        assert!((us(&n, 4, 100, true) - 4.0 * 2850.0).abs() < 1e-9);
        // With one: the head's 5 layers of flops per token at 10 000 layer-tokens/s = 500 µs per token.
        n.prefill_speed = Some(10_000.0);
        let head = Compute::of(&n, &c).head_us(4, 4);
        assert!((head - (2000.0 + 200.0)).abs() < 1e-9, "{head}");
        assert!(
            (Compute::of(&n, &c).head_us(1, 0) - 700.0).abs() < 1e-9,
            "memory-bound"
        );
        // A prompt chunk of 4 after 10 tokens reads 4·10 + 1+2+3+4 = 50 positions per layer.
        let chunk = Compute::of(&n, &c).chunk_us(2, 10, 4, false);
        assert!((chunk - 2.0 * (1000.0 + 25.0)).abs() < 1e-9, "{chunk}");
        assert!((Compute::of(&n, &c).attention_per_position_us(2) - 1.0).abs() < 1e-12);
    }

    /// A mixture-of-experts card: the node's speed is per layer a token reads (its active bytes), so the
    /// unmeasured head is priced in those layers, and the head's flops in active parameters.
    #[test]
    fn an_moe_head_is_priced_in_the_layers_a_token_reads() {
        let mut c = card();
        c.layer_bytes = 1000; // every expert
        c.active_layer_bytes = 100; // what a token reads
        c.head_bytes = 300;
        c.layer_params = 10_000;
        c.active_layer_params = 1000;
        c.head_params = 5000;
        let mut n = node("a", 1000.0);
        let last = Compute::of(&n, &c).stage_us(2, 1, 0, true);
        assert!(
            (last - 5000.0).abs() < 1e-9,
            "2 layers + the head as 3: {last}"
        );
        n.prefill_speed = Some(10_000.0);
        n.head_us = Some(700.0);
        // The head's 5 active layers of flops per token at 10 000 layer-tokens/s: 500 µs a token.
        let head = Compute::of(&n, &c).head_us(4, 0);
        assert!((head - 2000.0).abs() < 1e-9, "{head}");
    }
}
