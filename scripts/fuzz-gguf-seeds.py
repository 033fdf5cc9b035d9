#!/usr/bin/env python3
"""Writes the GGUF reader's fuzz seeds into DIR: a tiny but complete one-layer Llama-style model (byte-level
BPE vocabulary of 256 byte tokens and two specials, a ChatML template, F16 and Q8_0 weights; ~30 KB, so the
fuzzer mutates whole files), the same cut short, and one with only its metadata. Usage: fuzz-gguf-seeds.py DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import gguf

EMBD, FF, HEADS, KV_HEADS, CTX = 32, 32, 2, 1, 64
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode map, in byte order."""
    visible = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in visible:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def write(path: Path, quant: bool) -> None:
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(CTX)
    w.add_embedding_length(EMBD)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    tokens = byte_tokens() + ["<|im_start|>", "<|im_end|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3, 3])
    w.add_token_merges([])
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)
    w.add_chat_template(TEMPLATE)
    n_vocab = len(tokens)
    head = EMBD // HEADS
    shapes = {
        "token_embd.weight": (n_vocab, EMBD),
        "blk.0.attn_q.weight": (EMBD, EMBD),
        "blk.0.attn_k.weight": (KV_HEADS * head, EMBD),
        "blk.0.attn_v.weight": (KV_HEADS * head, EMBD),
        "blk.0.attn_output.weight": (EMBD, EMBD),
        "blk.0.ffn_gate.weight": (FF, EMBD),
        "blk.0.ffn_up.weight": (FF, EMBD),
        "blk.0.ffn_down.weight": (EMBD, FF),
    }
    for name, shape in shapes.items():
        data = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if quant and name != "token_embd.weight":
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, data.astype(np.float16))
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        w.add_tensor(name, np.ones(EMBD, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    write(out / "seed-f16", quant=False)
    write(out / "seed-q8_0", quant=True)
    whole = (out / "seed-q8_0").read_bytes()
    (out / "seed-cut").write_bytes(whole[: len(whole) * 2 // 3])
    (out / "seed-header").write_bytes(whole[:2048])
    print(f"gguf: 4 seeds ({len(whole)} bytes the largest)")


if __name__ == "__main__":
    main()
