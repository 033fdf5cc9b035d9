"""Per-family descriptions of the synthetic models: metadata keys and tensors as llama.cpp's converter writes them.

A `Family` names the GGUF architecture, the tokenizer kind (see synth_vocab.family_vocab), the metadata the converter
writes for that family and the per-family tensor features (QKV bias, QK-norm, Gemma's post norms, Phi-3's fused
QKV and gate+up, Llama 3's rope_freqs, mixture-of-experts layers). `Dims` are the sizes of one tier: `s` (tiny, embedding 64: every
architecture in F16 and the legacy block types) and `k` (embedding 256: rows a multiple of 256 so llama-quantize
makes real K-quants; only the families whose quantized path differs from llama's have one). `tensor_specs()` yields (name, shape, maker) in writing order, so a big model can be
written one tensor at a time; numpy shapes are ggml's reversed.

Weights are random normal, scaled so activations stay O(1) and the logits have a standard deviation of about
LOGIT_STD (so the top-1/top-2 gaps are not tiny); norm weights are 1 + N(0, 0.1).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

LOGIT_STD = 4.0
NORM_JITTER = 0.1
# attn_output and ffn_down are scaled up so the layers' sum outweighs the (tied) input embedding in the final
# residual; otherwise every position's top logit is its own input token and greedy decoding repeats one token
OUT_GAIN = 3.0
# Gemma adds sqrt(n_embd) * embedding to the residual and norms every layer's output: its post norms and final
# norm carry the gain instead (stored, as the converter stores them, as the norm's 1 + w)
GEMMA_POST_NORM = 2.5
GEMMA_OUTPUT_NORM = 4.0
# router (ffn_gate_inp) weights: logits of std ~3, so a token's expert probabilities are spread but decisive
ROUTER_STD = 3.0
# gpt-oss experts: gate/up pre-activations of std ~3, so llama.cpp's swiglu_oai clamp at 7 is met now and then
OSS_GATE_UP_STD = 3.0


@dataclass(frozen=True)
class Dims:
    n_embd: int
    n_head: int
    head_dim: int
    n_kv: int
    n_ff: int
    n_layer: int
    n_vocab: int


@dataclass(frozen=True)
class Family:
    name: str
    arch: str
    vocab: str
    tiers: dict[str, Dims]
    context: int
    rope_base: float
    rms_eps: float
    tied: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False
    gemma: bool = False  # post-attention/post-ffw norms, norms stored as 1 + w, embeddings scaled by sqrt(n_embd)
    fused: bool = False  # phi3: attn_qkv and ffn_up = [gate; up]
    llama3_rope: bool = False
    experts: "Experts | None" = None  # a mixture-of-experts feed-forward instead of the dense one
    # gpt-oss: biases on Q/K/V/O, attn_sinks, the FFN norm named post_attention_norm, router and expert biases,
    # YaRN rope keys; the experts' activation is llama.cpp's swiglu_oai
    gpt_oss: bool = False
    # glm4moe: the FFN norm named post_attention_norm, leading dense layers (extra_u32's
    # leading_dense_block_count), sigmoid routing with a selection bias (exp_probs_b), an ungated shared expert,
    # and `nextn` multi-token-prediction layers after the n_layer of the model (block_count counts them)
    glm: bool = False
    nextn: int = 0
    # deepseek2: multi-head latent attention (`Mla`: q/kv LoRA ranks, the split rope part, the absorbed
    # attn_k_b / attn_v_b current converters write), ffn_norm, leading dense layers, sigmoid routing with
    # exp_probs_b and group-limited top-k, an ungated shared expert, YaRN with yarn_log_multiplier
    mla: "Mla | None" = None
    write_vocab_size: bool = False  # LlamaModel writes <arch>.vocab_size and rope.dimension_count
    write_head_dim: bool = False  # config.json has head_dim -> key_length / value_length
    extra_u32: dict[str, int] = field(default_factory=dict)  # further <arch>.* keys the converter writes
    label: str = ""


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts layer: `count` routed experts of hidden size `ff`, `used` per token, and (when
    `shared_ff`) a shared expert gated by sigmoid(ffn_gate_inp_shexp . x), as Qwen 1.5/2 MoE."""
    count: int
    used: int
    ff: int
    shared_ff: int = 0


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention: queries through a rank-`q_lora` bottleneck, keys and values from one
    `kv_lora` latent per token plus a shared `rope`-wide rotated key part; per head `nope + rope` query/key
    values and `v_head` value values."""
    q_lora: int
    kv_lora: int
    nope: int
    rope: int
    v_head: int
    groups: int  # expert_group_count
    groups_used: int  # expert_group_used_count
    # V3: sigmoid routing (expert_gating_func 2) with exp_probs_b, weights renormalised and scaled by 2.5; V2:
    # no gating key (softmax), no selection bias, weights as they are, scale 1
    sigmoid: bool = True
    yarn_log_mul: float = 0.1  # 0.1 * mscale_all_dim
    # the layout converters wrote before llama.cpp cached the latent: all heads KV heads of the decompressed
    # key_length / value_length, no *_mla keys, attn_kv_b instead of attn_k_b / attn_v_b
    kv_b: bool = False


def _dims(d: int, n_head: int, hd: int, n_kv: int, ff: int, layers: int, vocab: int = 512) -> Dims:
    return Dims(d, n_head, hd, n_kv, ff, layers, vocab)


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("llama", "llama", "smollm", {"s": _dims(64, 2, 32, 1, 128, 2), "k": _dims(256, 4, 64, 2, 256, 2)},
           context=8192, rope_base=100000.0, rms_eps=1e-5, write_vocab_size=True,
           label="SmolLM2-like: llama arch, tied output, gpt2 BPE (smollm pre-tokenizer)"),
    Family("llama-untied", "llama", "tinyllama",
           {"s": _dims(64, 2, 32, 2, 128, 2)},
           context=2048, rope_base=10000.0, rms_eps=1e-5, tied=False, write_vocab_size=True,
           label="TinyLlama/Llama-2-like: llama arch, output.weight, no GQA, SentencePiece"),
    Family("llama3", "llama", "llama3", {"s": _dims(64, 2, 32, 1, 128, 2)},
           context=131072, rope_base=500000.0, rms_eps=1e-5, llama3_rope=True, write_vocab_size=True,
           write_head_dim=True, label="Llama-3.2-like: llama arch, rope_freqs (llama3 scaling), llama-bpe"),
    Family("mistral", "llama", "mistral", {"s": _dims(64, 2, 32, 1, 128, 2)},
           context=32768, rope_base=1000000.0, rms_eps=1e-5, tied=False, write_vocab_size=True,
           label="Mistral-7B-v0.3-like: the converter writes arch llama; SentencePiece with [INST]"),
    Family("qwen2", "qwen2", "qwen2", {"s": _dims(64, 2, 32, 1, 128, 2), "k": _dims(256, 4, 64, 2, 256, 2)},
           context=32768, rope_base=1000000.0, rms_eps=1e-6, qkv_bias=True,
           label="Qwen2.5-like: Q/K/V bias, tied output, qwen2 pre-tokenizer"),
    Family("qwen3", "qwen3", "qwen3", {"s": _dims(64, 4, 32, 2, 128, 2), "k": _dims(256, 2, 128, 1, 256, 2)},
           context=40960, rope_base=1000000.0, rms_eps=1e-6, qk_norm=True, write_head_dim=True,
           label="Qwen3-like: attn_q_norm/attn_k_norm, n_head*head_dim != n_embd, tied"),
    Family("gemma3", "gemma3", "gemma3", {"s": _dims(64, 2, 32, 1, 128, 6), "k": _dims(256, 2, 128, 1, 256, 6)},
           context=32768, rope_base=1000000.0, rms_eps=1e-6, qk_norm=True, gemma=True, write_head_dim=True,
           extra_u32={"attention.sliding_window": 8},
           label="Gemma-3-270M-like: sliding window 8 (every 6th layer global), QK-norm, pre/post norms, GELU"),
    Family("phi3", "phi3", "phi3", {"s": _dims(64, 2, 32, 1, 128, 2), "k": _dims(256, 4, 64, 2, 256, 2)},
           context=4096, rope_base=10000.0, rms_eps=1e-5, tied=False, fused=True,
           extra_u32={"rope.scaling.original_context_length": 4096, "attention.sliding_window": 2047},
           label="Phi-3-like: fused attn_qkv, ffn_up = [gate; up], sliding_window key (ignored by llama.cpp)"),
    Family("qwen3moe", "qwen3moe", "qwen3", {"k": _dims(256, 2, 128, 1, 256, 2)},
           context=40960, rope_base=1000000.0, rms_eps=1e-6, qk_norm=True, write_head_dim=True,
           experts=Experts(count=8, used=2, ff=128),
           label="Qwen3-30B-A3B-like: 8 routed experts, top-2 renormalised, QK-norm, tied"),
    Family("qwen2moe", "qwen2moe", "qwen2", {"k": _dims(256, 4, 64, 2, 256, 2)},
           context=32768, rope_base=1000000.0, rms_eps=1e-6, qkv_bias=True, tied=False,
           experts=Experts(count=8, used=4, ff=64, shared_ff=256),
           label="Qwen1.5-MoE-like: 8 routed experts, top-4 softmax weights as they are, sigmoid-gated "
                 "shared expert, Q/K/V bias, untied"),
    Family("gpt-oss", "gpt-oss", "gpt-oss", {"k": _dims(256, 4, 64, 2, 128, 2)},
           context=131072, rope_base=150000.0, rms_eps=1e-5, tied=False, qkv_bias=True, write_head_dim=True,
           experts=Experts(count=4, used=2, ff=128), gpt_oss=True,
           extra_u32={"attention.sliding_window": 8},
           label="gpt-oss-20b-like: 4 experts of ff 128, top-2 over the biased router logits then softmax, "
                 "swiglu_oai, per-expert biases, Q/K/V/O biases, attention sinks, sliding window 8 on even layers, "
                 "YaRN (factor 32, original context 4096), gpt-4o pre-tokenizer, untied"),
    Family("glm4moe", "glm4moe", "qwen2", {"k": _dims(256, 4, 64, 2, 256, 3)},
           context=131072, rope_base=1000000.0, rms_eps=1e-5, tied=False, qkv_bias=True, qk_norm=True,
           write_head_dim=True, experts=Experts(count=8, used=2, ff=32, shared_ff=32), glm=True, nextn=1,
           extra_u32={"rope.dimension_count": 32, "leading_dense_block_count": 1, "expert_shared_count": 1,
                      "expert_gating_func": 2, "nextn_predict_layers": 1},
           label="GLM-4.5-like: layer 0 dense, then 8 experts top-2 chosen on sigmoid scores + exp_probs_b, "
                 "weighted by the scores renormalised and scaled by 2.5, an ungated shared expert; Q/K/V bias, "
                 "QK-norm, rotary on half of each head, one nextn (MTP) layer after the 3, qwen2 tokenizer, untied"),
    Family("deepseek2", "deepseek2", "qwen2", {"k": _dims(256, 4, 96, 1, 256, 2)},
           context=163840, rope_base=10000.0, rms_eps=1e-6, tied=False,
           experts=Experts(count=8, used=2, ff=32, shared_ff=32),
           mla=Mla(q_lora=256, kv_lora=256, nope=64, rope=32, v_head=64, groups=2, groups_used=1),
           extra_u32={"leading_dense_block_count": 1},
           label="DeepSeek-V3-like: multi-head latent attention (q_lora 256, kv_lora 256, 4 heads of nope 64 + "
                 "rope 32, v_head 64; absorbed attn_k_b / attn_v_b, one KV head of 288), layer 0 dense, then 8 "
                 "experts in 2 groups (1 group used) top-2 chosen on sigmoid + exp_probs_b, renormalised and "
                 "scaled by 2.5, an ungated shared expert; YaRN factor 40 with yarn_log_multiplier 0.1; untied"),
    Family("deepseek2-kvb", "deepseek2", "qwen2", {"k": _dims(256, 4, 96, 4, 256, 2)},
           context=163840, rope_base=10000.0, rms_eps=1e-6, tied=False,
           experts=Experts(count=8, used=2, ff=32, shared_ff=32),
           mla=Mla(q_lora=256, kv_lora=256, nope=64, rope=32, v_head=64, groups=2, groups_used=1, kv_b=True),
           extra_u32={"leading_dense_block_count": 1},
           label="DeepSeek-V3-like in the older layout: attn_kv_b (keys' and values' rows per head) instead of "
                 "attn_k_b / attn_v_b, head_count_kv 4, key_length 96 / value_length 64, no *_mla keys; "
                 "llama.cpp runs it as full multi-head attention over decompressed keys and values"),
    Family("deepseek2-lite", "deepseek2", "qwen2", {"k": _dims(256, 4, 96, 1, 256, 2)},
           context=163840, rope_base=10000.0, rms_eps=1e-6, tied=False,
           experts=Experts(count=6, used=2, ff=32, shared_ff=64),
           mla=Mla(q_lora=0, kv_lora=256, nope=64, rope=32, v_head=64, groups=1, groups_used=1, sigmoid=False,
                   yarn_log_mul=0.0707),
           extra_u32={"leading_dense_block_count": 1},
           label="DeepSeek-V2-Lite-like: latent attention without the query bottleneck (attn_q, q_lora_rank 0), "
                 "layer 0 dense, then 6 experts top-2 of a softmax (no gating key, as V2 files), weights as they "
                 "are, no selection bias, one group; two shared experts; YaRN with mscale_all_dim 0.707; untied"),
]}


def llama3_rope_factors(head_dim: int, base: float, factor: float = 32.0, low: float = 1.0, high: float = 4.0,
                        old_ctx: int = 8192) -> np.ndarray:
    """rope_freqs.weight as the converter computes it for rope_type 'llama3' (Llama 3.2's parameters)."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (base ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_metadata(w, fam: Family, dims: Dims) -> None:
    """The `<arch>.*` keys in the converter's order (TextModel.set_gguf_parameters plus the family's own)."""
    a = fam.arch
    w.add_uint32(f"{a}.block_count", dims.n_layer + fam.nextn)
    w.add_uint32(f"{a}.context_length", fam.context)
    w.add_uint32(f"{a}.embedding_length", dims.n_embd)
    w.add_uint32(f"{a}.feed_forward_length", dims.n_ff)
    w.add_uint32(f"{a}.attention.head_count", dims.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", dims.n_kv)
    w.add_float32(f"{a}.rope.freq_base", fam.rope_base)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", fam.rms_eps)
    if fam.write_head_dim:
        w.add_uint32(f"{a}.attention.key_length", dims.head_dim)
        w.add_uint32(f"{a}.attention.value_length", dims.head_dim)
    if fam.fused:
        w.add_uint32(f"{a}.rope.dimension_count", dims.head_dim)
    for key, val in fam.extra_u32.items():
        w.add_uint32(f"{a}.{key}", val)
    if fam.experts:
        w.add_uint32(f"{a}.expert_count", fam.experts.count)
        w.add_uint32(f"{a}.expert_used_count", fam.experts.used)
        w.add_uint32(f"{a}.expert_feed_forward_length", fam.experts.ff)
        if fam.experts.shared_ff and not fam.glm and not fam.mla:  # GLM and DeepSeek write expert_shared_count
            w.add_uint32(f"{a}.expert_shared_feed_forward_length", fam.experts.shared_ff)
    if fam.glm:
        w.add_float32(f"{a}.expert_weights_scale", 2.5)
        w.add_bool(f"{a}.expert_weights_norm", True)
    if fam.gpt_oss:
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", 32.0)
        w.add_uint32(f"{a}.rope.scaling.original_context_length", 4096)
    if fam.mla:
        _write_mla_metadata(w, fam, dims)
    if fam.write_vocab_size:
        w.add_uint32(f"{a}.vocab_size", dims.n_vocab)
        w.add_uint32(f"{a}.rope.dimension_count", dims.head_dim)


def _write_mla_metadata(w, fam: Family, dims: Dims) -> None:
    """DeepseekV2Model.set_gguf_parameters' keys (after the common ones): MLA converts into MQA with one KV head
    of kv_lora + rope (key_length) and kv_lora values (value_length); the decompressed sizes are the *_mla
    keys. YaRN as DeepSeek V3 ships it (factor 40, original context 4096, mscale_all_dim 1 written as 0.1)."""
    a, m, ex = fam.arch, fam.mla, fam.experts
    if m.sigmoid:
        w.add_uint32(f"{a}.expert_gating_func", 2)
    w.add_uint32(f"{a}.expert_group_count", m.groups)
    w.add_uint32(f"{a}.expert_group_used_count", m.groups_used)
    w.add_uint32(f"{a}.vocab_size", dims.n_vocab)
    w.add_uint32(f"{a}.attention.q_lora_rank", m.q_lora)
    w.add_uint32(f"{a}.attention.kv_lora_rank", m.kv_lora)
    if m.kv_b:
        w.add_uint32(f"{a}.attention.key_length", m.nope + m.rope)
        w.add_uint32(f"{a}.attention.value_length", m.v_head)
    else:
        w.add_uint32(f"{a}.attention.key_length", m.kv_lora + m.rope)
        w.add_uint32(f"{a}.attention.value_length", m.kv_lora)
        w.add_uint32(f"{a}.attention.key_length_mla", m.nope + m.rope)
        w.add_uint32(f"{a}.attention.value_length_mla", m.v_head)
    w.add_uint32(f"{a}.expert_shared_count", ex.shared_ff // ex.ff)
    w.add_float32(f"{a}.expert_weights_scale", 2.5 if m.sigmoid else 1.0)
    if m.sigmoid:
        w.add_bool(f"{a}.expert_weights_norm", True)
    w.add_uint32(f"{a}.rope.dimension_count", m.rope)
    w.add_string(f"{a}.rope.scaling.type", "yarn")
    w.add_float32(f"{a}.rope.scaling.factor", 40.0)
    w.add_uint32(f"{a}.rope.scaling.original_context_length", 4096)
    w.add_float32(f"{a}.rope.scaling.yarn_log_multiplier", m.yarn_log_mul)


class _Rng:
    """One independent normal stream per tensor, keyed by (seed, family, tier, tensor name)."""

    CHUNK = 1 << 22  # elements generated at a time, so a 1B model's embedding never exists in f32 as a whole

    def __init__(self, seed: int, fam: str, tier: str):
        self.key = [seed, zlib.crc32(fam.encode()), zlib.crc32(tier.encode())]

    def normal(self, name: str, shape: tuple[int, ...], std: float, mean: float = 0.0,
               dtype: type = np.float32) -> np.ndarray:
        rng = np.random.default_rng(self.key + [zlib.crc32(name.encode())])
        out = np.empty(shape, dtype=dtype)
        flat = out.reshape(-1)
        for lo in range(0, flat.size, self.CHUNK):
            n = min(self.CHUNK, flat.size - lo)
            x = rng.standard_normal(size=n, dtype=np.float32)
            flat[lo:lo + n] = x * np.float32(std) + np.float32(mean)
        return out


Maker = Callable[[type], np.ndarray]


def tensor_specs(fam: Family, dims: Dims, seed: int, tier: str) -> Iterator[tuple[str, tuple[int, ...], Maker]]:
    """(name, numpy shape, make(dtype)) for every tensor of one model, in writing order; 2-D and 3-D weights are
    made in the requested dtype, 1-D tensors and the routers (ffn_gate_inp, ffn_gate_inp_shexp: the converter
    keeps them F32) always in F32."""
    r = _Rng(seed, fam.name, tier)
    d, hd, ff, v = dims.n_embd, dims.head_dim, dims.n_ff, dims.n_vocab
    q_dim, kv_dim = dims.n_head * hd, dims.n_kv * hd

    def normal(name: str, shape: tuple[int, ...], std: float, mean: float = 0.0):
        return name, shape, lambda dt: r.normal(name, shape, std, mean, dt if len(shape) >= 2 else np.float32)

    def f32(name: str, shape: tuple[int, ...], std: float):
        return name, shape, lambda dt: r.normal(name, shape, std, 0.0, np.float32)

    def norm(name: str, n: int, mean: float = 1.0):
        return normal(name, (n,), NORM_JITTER * mean, mean)

    def fused(name: str, parts: list[tuple[str, int, float]]):
        shape = (sum(rows for _, rows, _ in parts), d)
        return name, shape, lambda dt: np.concatenate([r.normal(pn, (rows, d), std, 0.0, dt) for pn, rows, std in parts])

    # A tied embedding is also the output matrix: its scale sets the logits' spread. Gemma multiplies the
    # embedding by sqrt(n_embd) on input, which the same scale keeps O(1)-ish.
    emb_std = LOGIT_STD / math.sqrt(d) if fam.tied else 0.5
    if fam.gemma:
        emb_std = LOGIT_STD / GEMMA_OUTPUT_NORM / math.sqrt(d)
    yield normal("token_embd.weight", (v, d), emb_std)
    if fam.llama3_rope:
        yield "rope_freqs.weight", (hd // 2,), lambda dt: llama3_rope_factors(hd, fam.rope_base)
    for i in range(dims.n_layer + fam.nextn):
        p = f"blk.{i}."
        yield norm(p + "attn_norm.weight", d)
        if fam.mla:
            yield from _mla_specs(p, fam, dims, i, normal, f32, norm, r)
            continue
        qkv = [(p + "attn_q.weight", q_dim, 1.2 / math.sqrt(d)), (p + "attn_k.weight", kv_dim, 1.2 / math.sqrt(d)),
               (p + "attn_v.weight", kv_dim, 1.0 / math.sqrt(d))]
        if fam.fused:
            yield fused(p + "attn_qkv.weight", qkv)
        else:
            for name, rows, std in qkv:
                yield normal(name, (rows, d), std)
        if fam.qkv_bias:
            yield normal(p + "attn_q.bias", (q_dim,), 0.2)
            yield normal(p + "attn_k.bias", (kv_dim,), 0.2)
            yield normal(p + "attn_v.bias", (kv_dim,), 0.2)
        if fam.qk_norm:
            yield norm(p + "attn_q_norm.weight", hd)
            yield norm(p + "attn_k_norm.weight", hd)
        yield normal(p + "attn_output.weight", (d, q_dim), OUT_GAIN / math.sqrt(q_dim))
        if fam.gpt_oss:
            yield from _oss_specs(p, fam.experts, d, dims.n_head, normal, f32)
            continue
        if fam.glm:
            yield from _glm_specs(p, fam, dims, i, normal, f32, norm)
            continue
        if fam.gemma:
            yield norm(p + "post_attention_norm.weight", d, GEMMA_POST_NORM)
        yield norm(p + "ffn_norm.weight", d)
        if fam.experts:
            yield from _moe_specs(p, fam.experts, d, normal, f32)
            continue
        gate_up = [(p + "ffn_gate.weight", ff, 1.0 / math.sqrt(d)), (p + "ffn_up.weight", ff, 1.0 / math.sqrt(d))]
        if fam.fused:
            yield fused(p + "ffn_up.weight", gate_up)
        else:
            for name, rows, std in gate_up:
                yield normal(name, (rows, d), std)
        yield normal(p + "ffn_down.weight", (d, ff), OUT_GAIN / math.sqrt(ff))
        if fam.gemma:
            yield norm(p + "post_ffw_norm.weight", d, GEMMA_POST_NORM)
    yield norm("output_norm.weight", d, GEMMA_OUTPUT_NORM if fam.gemma else 1.0)
    if not fam.tied:
        yield normal("output.weight", (v, d), LOGIT_STD / math.sqrt(d))


def _moe_specs(p: str, ex: Experts, d: int, normal, f32):
    """A mixture-of-experts layer's tensors after ffn_norm, as the converter writes them: the router, the
    experts stacked in 3-D tensors (numpy [count, rows, cols]), then the shared expert."""
    yield f32(p + "ffn_gate_inp.weight", (ex.count, d), ROUTER_STD / math.sqrt(d))
    yield normal(p + "ffn_gate_exps.weight", (ex.count, ex.ff, d), 1.0 / math.sqrt(d))
    yield normal(p + "ffn_up_exps.weight", (ex.count, ex.ff, d), 1.0 / math.sqrt(d))
    yield normal(p + "ffn_down_exps.weight", (ex.count, d, ex.ff), OUT_GAIN / math.sqrt(ex.ff))
    if ex.shared_ff:
        f = ex.shared_ff
        yield f32(p + "ffn_gate_inp_shexp.weight", (1, d), 1.0 / math.sqrt(d))
        yield normal(p + "ffn_gate_shexp.weight", (f, d), 1.0 / math.sqrt(d))
        yield normal(p + "ffn_up_shexp.weight", (f, d), 1.0 / math.sqrt(d))
        yield normal(p + "ffn_down_shexp.weight", (d, f), OUT_GAIN / math.sqrt(f))


def _oss_specs(p: str, ex: Experts, d: int, n_head: int, normal, f32):
    """A gpt-oss layer's tensors after attn_output: its bias, the sinks (one logit per head), the FFN norm (named
    post_attention_norm, as llama.cpp loads it), the router with its bias and the experts with theirs."""
    yield normal(p + "attn_output.bias", (d,), 0.2)
    yield normal(p + "attn_sinks.weight", (n_head,), 1.0, 1.0)
    yield normal(p + "post_attention_norm.weight", (d,), NORM_JITTER, 1.0)
    yield f32(p + "ffn_gate_inp.weight", (ex.count, d), ROUTER_STD / math.sqrt(d))
    yield normal(p + "ffn_gate_inp.bias", (ex.count,), 0.5)
    yield normal(p + "ffn_gate_exps.weight", (ex.count, ex.ff, d), OSS_GATE_UP_STD / math.sqrt(d))
    yield f32(p + "ffn_gate_exps.bias", (ex.count, ex.ff), 0.2)
    yield normal(p + "ffn_up_exps.weight", (ex.count, ex.ff, d), OSS_GATE_UP_STD / math.sqrt(d))
    yield f32(p + "ffn_up_exps.bias", (ex.count, ex.ff), 0.2)
    yield normal(p + "ffn_down_exps.weight", (ex.count, d, ex.ff), 1.0 / math.sqrt(ex.ff))
    yield f32(p + "ffn_down_exps.bias", (ex.count, d), 0.2)


def _glm_specs(p: str, fam: Family, dims: Dims, i: int, normal, f32, norm):
    """A glm4moe layer's tensors after attn_output: the FFN norm (post_attention_norm), the feed-forward of
    `_leading_dense_or_biased_moe`; a nextn layer (i >= n_layer) then has its MTP tensors, which llama.cpp (and
    shoal) do not run."""
    d = dims.n_embd
    yield norm(p + "post_attention_norm.weight", d)
    yield from _leading_dense_or_biased_moe(p, fam, dims, i, normal, f32)
    if i >= dims.n_layer:
        yield normal(p + "nextn.eh_proj.weight", (d, 2 * d), 1.0 / math.sqrt(2 * d))
        yield norm(p + "nextn.enorm.weight", d)
        yield norm(p + "nextn.hnorm.weight", d)
        yield norm(p + "nextn.shared_head_norm.weight", d)


def _mla_specs(p: str, fam: Family, dims: Dims, i: int, normal, f32, norm, r: "_Rng"):
    """A deepseek2 layer after attn_norm, as llama.cpp loads it: the query bottleneck (attn_q_a, its norm,
    attn_q_b), the latent and rope key (attn_kv_a_mqa: kv_lora + rope rows) and its norm, the absorbed
    per-head attn_k_b (numpy [head, kv_lora, nope]: k_b_proj transposed) and attn_v_b ([head, v_head, kv_lora]),
    attn_output, ffn_norm, then the feed-forward of `_leading_dense_or_biased_moe`."""
    m, d, nh = fam.mla, dims.n_embd, dims.n_head
    if m.q_lora:
        yield normal(p + "attn_q_a.weight", (m.q_lora, d), 1.0 / math.sqrt(d))
        yield norm(p + "attn_q_a_norm.weight", m.q_lora)
        yield normal(p + "attn_q_b.weight", (nh * (m.nope + m.rope), m.q_lora), 1.0 / math.sqrt(m.q_lora))
    else:
        yield normal(p + "attn_q.weight", (nh * (m.nope + m.rope), d), 1.0 / math.sqrt(d))
    yield normal(p + "attn_kv_a_mqa.weight", (m.kv_lora + m.rope, d), 1.2 / math.sqrt(d))
    yield norm(p + "attn_kv_a_norm.weight", m.kv_lora)
    if m.kv_b:
        # per head nope key rows (1.2 / sqrt(kv_lora): the same q_abs scale as k_b's) then v_head value rows
        yield p + "attn_kv_b.weight", (nh * (m.nope + m.v_head), m.kv_lora), lambda dt: np.concatenate([
            np.concatenate([r.normal(f"{p}attn_kv_b.k.{h}", (m.nope, m.kv_lora), 1.2 / math.sqrt(m.kv_lora), 0.0, dt),
                            r.normal(f"{p}attn_kv_b.v.{h}", (m.v_head, m.kv_lora), 1.0 / math.sqrt(m.kv_lora), 0.0,
                                     dt)]) for h in range(nh)])
    else:
        yield normal(p + "attn_k_b.weight", (nh, m.kv_lora, m.nope), 1.2 / math.sqrt(m.nope))
        yield normal(p + "attn_v_b.weight", (nh, m.v_head, m.kv_lora), 1.0 / math.sqrt(m.kv_lora))
    yield normal(p + "attn_output.weight", (d, nh * m.v_head), OUT_GAIN / math.sqrt(nh * m.v_head))
    yield norm(p + "ffn_norm.weight", d)
    yield from _leading_dense_or_biased_moe(p, fam, dims, i, normal, f32, bias=m.sigmoid)


def _leading_dense_or_biased_moe(p: str, fam: Family, dims: Dims, i: int, normal, f32, bias: bool = True):
    """glm4moe's and deepseek2's feed-forward tensors after their norm: a dense FFN on the leading layers, else the
    router, the selection bias (exp_probs_b, when `bias`), the experts and the ungated shared expert."""
    ex, d, ff = fam.experts, dims.n_embd, dims.n_ff
    if i < fam.extra_u32.get("leading_dense_block_count", 0):
        yield normal(p + "ffn_gate.weight", (ff, d), 1.0 / math.sqrt(d))
        yield normal(p + "ffn_up.weight", (ff, d), 1.0 / math.sqrt(d))
        yield normal(p + "ffn_down.weight", (d, ff), OUT_GAIN / math.sqrt(ff))
        return
    yield f32(p + "ffn_gate_inp.weight", (ex.count, d), ROUTER_STD / math.sqrt(d))
    if bias:
        yield f32(p + "exp_probs_b.bias", (ex.count,), 0.5)
    yield normal(p + "ffn_gate_exps.weight", (ex.count, ex.ff, d), 1.0 / math.sqrt(d))
    yield normal(p + "ffn_up_exps.weight", (ex.count, ex.ff, d), 1.0 / math.sqrt(d))
    yield normal(p + "ffn_down_exps.weight", (ex.count, d, ex.ff), OUT_GAIN / math.sqrt(ex.ff))
    f = ex.shared_ff
    yield normal(p + "ffn_gate_shexp.weight", (f, d), 1.0 / math.sqrt(d))
    yield normal(p + "ffn_up_shexp.weight", (f, d), 1.0 / math.sqrt(d))
    yield normal(p + "ffn_down_shexp.weight", (d, f), OUT_GAIN / math.sqrt(f))
