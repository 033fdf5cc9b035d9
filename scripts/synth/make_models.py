#!/usr/bin/env python3
"""Writes small random-weight GGUFs of every architecture shoal runs, deterministically from --seed.

Fixtures (into --out, default crates/shoal-model/tests/fixtures/synth):
- tier `s` (n_embd 64): `<family>-s-f16.gguf` for every family, plus llama-quantize variants of `llama`
  (BF16, Q8_0, Q4_0, Q5_0, Q5_1: block types that need rows of 32 only);
- tier `k` (n_embd 256, rows a multiple of 256, so llama-quantize makes real K-quants): `<family>-k-q4_k_m.gguf`
  for llama, qwen2, qwen3, gemma3 and phi3 (the families whose quantized path differs from llama's), plus Q5_K_M
  of `llama`, the mixture-of-experts qwen3moe, qwen2moe and glm4moe (tier k only) and gpt-oss (`-k-mxfp4_moe`: MXFP4
  experts); their F16 bases go to a
  temporary folder and are not kept (--keep-bases keeps them).
`--families A B` writes only those families and replaces only their entries in the existing manifest.json.
The set is cut to keep the committed fixtures near 10 MB; see the README next to them.
- `manifest.json`: per fixture the family, tier, dims, the prompt token ids (BOS first where the family adds
  BOS) and the texts whose tokenization reference.py records.
`--bench-1b [--out DIR]` instead writes a Llama-3.2-1B-shaped model in Q4_K_M for benchmarks (not committed;
default folder bench-out/synth, which git ignores); `--bench-moe` a Qwen3-MoE-shaped one (64 experts, 8 used);
`--bench-moe-3b` one with Qwen3-30B-A3B's layers (128 experts of ff 768, 8 used) but 6 of them: 3.9 B parameters
held, 0.47 B read per token, 2.3 GB in Q4_K_M (needs ~10 GB of free disk while its F16 base exists);
`--bench-mla` a deepseek2 whose latent attention has DeepSeek V3's size (128 heads) in 3 small-FFN layers.

Families, metadata and tensors: synth_archs.py; tokenizers: synth_vocab.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from importlib import metadata
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

import gguf

import synth_archs as sa
import synth_vocab as sv

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "crates/shoal-model/tests/fixtures/synth"
BENCH_OUT = REPO / "bench-out/synth"
DEFAULT_QUANTIZE = Path(os.environ.get("LLAMA_CPP_DIR", "/work/llama.cpp")) / "build/bin/llama-quantize"
PROMPT_LEN = 24

# the file types written per tier and family (F16 directly, the rest with llama-quantize from the F16 base)
S_VARIANTS = {"llama": ["F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q5_1"]}
# gpt-oss ships its experts in MXFP4: llama-quantize's MXFP4_MOE makes them so
K_VARIANTS = {"llama": ["Q4_K_M", "Q5_K_M"], "gpt-oss": ["MXFP4_MOE"]}
DEFAULT_VARIANTS = {"s": ["F16"], "k": ["Q4_K_M"]}

TEXTS_COMMON = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "  Numbers: 3.14159, 2024 and 1234567;   caf\u00e9, na\u00efve, \u65e5\u672c\u8a9e \u2014 done.\n\tTabbed line\n\n",
]
TEXTS_SPECIAL = {
    "smollm": "<|im_start|>user\nWhat's 7*8?<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>user<|end_header_id|>\n\nWhat's 7*8?<|eot_id|>",
    "qwen2": "<|im_start|>user\nWhat's 7*8?<|im_end|>\n<|im_start|>assistant\n",
    "qwen3": "<|im_start|>user\nWhat's 7*8?<|im_end|>\n<|im_start|>assistant\n<think>\nfifty-six\n</think>\n\n56",
    "tinyllama": "<s> Hello</s> again <unk>",
    "mistral": "[INST] What's 7*8? [/INST] 56</s>",
    "gemma3": "<start_of_turn>user\nWhat's 7*8?<end_of_turn>\n<start_of_turn>model\n",
    "phi3": "<|user|>\nWhat's 7*8?<|end|>\n<|assistant|>\n",
    "gpt-oss": "<|start|>user<|message|>What's 7*8?<|end|><|start|>assistant<|channel|>final<|message|>56<|return|>",
}


def fixture_name(family: str, tier: str, ftype: str) -> str:
    return f"{family}-{tier}-{ftype.lower()}"


def prompt_ids(seed: int, fam: sa.Family, vocab: sv.Vocab) -> list[int]:
    """PROMPT_LEN ids drawn from the ordinary tokens, BOS first where the family adds BOS."""
    rng = np.random.default_rng([seed, zlib.crc32(fam.name.encode()), 0x9E37])
    pool = vocab.normal_ids()
    n_draw = PROMPT_LEN - (1 if vocab.add_bos else 0)
    drawn = [int(pool[i]) for i in rng.integers(0, len(pool), size=n_draw)]
    return ([vocab.special_ids["bos"]] if vocab.add_bos else []) + drawn


def write_f16_base(path: Path, fam: sa.Family, dims: sa.Dims, vocab: sv.Vocab, seed: int, tier: str) -> None:
    """The converter's --outtype f16 layout: 2-D weights F16, 1-D tensors (norms, biases, rope_freqs) F32."""
    w = gguf.GGUFWriter(str(path), fam.arch)
    w.add_type("model")
    w.add_name(f"Synthetic {fam.name} ({tier})")
    sa.write_metadata(w, fam, dims)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    sv.write_vocab(w, vocab)
    for name, _, make in sa.tensor_specs(fam, dims, seed, tier):
        w.add_tensor(name, make(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(binary: Path, src: Path, dst: Path, ftype: str) -> None:
    res = subprocess.run([str(binary), str(src), str(dst), ftype, "2"], capture_output=True, text=True)
    if res.returncode != 0 or not dst.is_file():
        sys.exit(f"llama-quantize {ftype} failed for {src.name}:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}")


def make_fixtures(out: Path, seed: int, binary: Path, families: list[str], keep_bases: bool) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    with tempfile.TemporaryDirectory(prefix="synth-") as tmp:
        for fname in families:
            fam = sa.FAMILIES[fname]
            for tier in fam.tiers:
                dims = fam.tiers[tier]
                vocab = sv.family_vocab(fam.vocab, dims.n_vocab)
                base_dir = out if (tier == "s" or keep_bases) else Path(tmp)
                base = base_dir / f"{fixture_name(fname, tier, 'F16')}.gguf"
                write_f16_base(base, fam, dims, vocab, seed, tier)
                ftypes = (S_VARIANTS if tier == "s" else K_VARIANTS).get(fname, DEFAULT_VARIANTS[tier])
                if keep_bases and tier == "k":
                    ftypes = ["F16"] + ftypes
                for ftype in ftypes:
                    name = fixture_name(fname, tier, ftype)
                    path = out / f"{name}.gguf"
                    if ftype != "F16":
                        quantize(binary, base, path, ftype)
                    entry = {
                        "name": name, "file": path.name, "family": fname, "arch": fam.arch, "tier": tier,
                        "ftype": ftype, "label": fam.label,
                        "dims": {k: getattr(dims, k) for k in dims.__dataclass_fields__},
                        "add_bos": bool(vocab.add_bos), "prompt": prompt_ids(seed, fam, vocab),
                        "texts": TEXTS_COMMON + [TEXTS_SPECIAL[fam.vocab]],
                        "bytes": path.stat().st_size,
                    }
                    if fam.experts:
                        entry["experts"] = {k: getattr(fam.experts, k) for k in fam.experts.__dataclass_fields__}
                    if fam.mla:
                        entry["mla"] = {k: getattr(fam.mla, k) for k in fam.mla.__dataclass_fields__}
                    entries.append(entry)
                    print(f"{path.name:32s} {path.stat().st_size:>9,d} bytes")
    return entries


def bench_vocab(n_vocab: int) -> sv.Vocab:
    """Llama 3's layout at full size: bytes + learned merges, unused fillers up to 128000, then 256 specials."""
    small = sv.family_vocab("llama3", 512)
    n_named = 10
    body_tokens, body_types = small.tokens[:-n_named], small.types[:-n_named]
    n_special = 256
    fill = n_vocab - n_special - len(body_tokens)
    tokens = body_tokens + [f"[PAD{i}]" for i in range(fill)]
    types = body_types + [sv.UNUSED] * fill
    named = small.tokens[-n_named:]
    tokens += named + [f"<|reserved_special_token_{i + 2}|>" for i in range(n_special - n_named)]
    types += [sv.CONTROL] * n_special
    v = sv.Vocab(model="gpt2", pre="llama-bpe", tokens=tokens, types=types, merges=small.merges)
    v.special_ids = {"bos": tokens.index("<|begin_of_text|>"), "eos": tokens.index("<|eot_id|>")}
    v.add_bos, v.chat_template = True, sv.LLAMA3_TEMPLATE
    return v


def make_bench_1b(out: Path, seed: int, binary: Path) -> None:
    """Llama 3.2 1B's shape (2048 x 16 layers, ffn 8192, 32/8 heads, 128256 vocab, tied) in Q4_K_M."""
    dims = sa.Dims(n_embd=2048, n_head=32, head_dim=64, n_kv=8, n_ff=8192, n_layer=16, n_vocab=128256)
    make_bench(out, seed, binary, sa.FAMILIES["llama3"], dims, "synth-llama3-1b", "Synthetic llama3 1B (benchmark)")


def make_bench_moe(out: Path, seed: int, binary: Path) -> None:
    """A Qwen3-MoE-shaped model in Q4_K_M: 1024 x 8 layers, 64 experts of ff 512 with 8 used, 16/4 heads of 64,
    vocab 32768, tied: ~0.84 B parameters held, ~0.15 B read per token (not committed)."""
    fam = dataclasses.replace(sa.FAMILIES["qwen3moe"], experts=sa.Experts(count=64, used=8, ff=512))
    dims = sa.Dims(n_embd=1024, n_head=16, head_dim=64, n_kv=4, n_ff=4096, n_layer=8, n_vocab=32768)
    make_bench(out, seed, binary, fam, dims, "synth-qwen3moe-a0.15b", "Synthetic qwen3moe (benchmark)")


def make_bench_moe_3b(out: Path, seed: int, binary: Path) -> None:
    """Qwen3-30B-A3B's layer shape (n_embd 2048, 32 query / 4 KV heads of 128, 128 experts of ff 768 with 8
    used, QK-norm) with 6 layers and a tied 65536-token vocabulary in Q4_K_M: ~3.87 B parameters held, ~0.47 B
    read per token (attention 19 M, router 0.26 M and 8 experts 38 M per layer; the 134 M head), ~2.3 GB:
    a bandwidth-bound MoE far larger than any cache (not committed; the F16 base, ~7.7 GB, is deleted once
    quantized)."""
    fam = dataclasses.replace(sa.FAMILIES["qwen3moe"], experts=sa.Experts(count=128, used=8, ff=768))
    dims = sa.Dims(n_embd=2048, n_head=32, head_dim=128, n_kv=4, n_ff=6144, n_layer=6, n_vocab=65536)
    make_bench(out, seed, binary, fam, dims, "synth-qwen3moe-3.9b-a0.47b",
               "Synthetic qwen3moe 3.9B-A0.47B (benchmark)")


def make_bench_mla(out: Path, seed: int, binary: Path) -> None:
    """DeepSeek V3's latent attention at full size (n_embd 7168, 128 heads, q_lora 1536, kv_lora 512, nope 128,
    rope 64, v_head 128: 187 M parameters per layer) with a small feed-forward (layer 0 dense of ff 512, then
    16 experts of ff 256 in 8 groups, 4 groups and 4 experts used, one shared) and a 2048-token vocabulary,
    3 layers, Q4_K_M: the attention is nearly all a token reads, for timing its parts (not committed)."""
    mla = sa.Mla(q_lora=1536, kv_lora=512, nope=128, rope=64, v_head=128, groups=8, groups_used=4)
    fam = dataclasses.replace(sa.FAMILIES["deepseek2"], mla=mla,
                              experts=sa.Experts(count=16, used=4, ff=256, shared_ff=256))
    dims = sa.Dims(n_embd=7168, n_head=128, head_dim=192, n_kv=1, n_ff=512, n_layer=3, n_vocab=2048)
    make_bench(out, seed, binary, fam, dims, "synth-deepseek2-mla-v3",
               "Synthetic deepseek2, V3 attention (benchmark)")


def make_bench(out: Path, seed: int, binary: Path, fam: sa.Family, dims: sa.Dims, stem: str, title: str) -> None:
    """`fam` at `dims` in Q4_K_M, written tensor by tensor so the F16 base never sits in memory as a whole; the
    base is deleted afterwards."""
    vocab = bench_vocab(dims.n_vocab)
    out.mkdir(parents=True, exist_ok=True)
    base = out / f"{stem}-f16.gguf"
    dst = out / f"{stem}-q4_k_m.gguf"
    t0 = time.time()
    w = gguf.GGUFWriter(str(base), fam.arch)
    w.add_type("model")
    w.add_name(title)
    sa.write_metadata(w, fam, dims)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    sv.write_vocab(w, vocab)
    specs = list(sa.tensor_specs(fam, dims, seed, "bench"))
    made = []
    for name, shape, make in specs:
        # 2-D and 3-D weights F16, the rest (and the routers, which the maker keeps F32) as made
        dtype = np.float16 if len(shape) >= 2 and "ffn_gate_inp" not in name else np.float32
        made.append(dtype)
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for (name, shape, make), dtype in zip(specs, made):
        w.write_tensor_data(make(np.float16).astype(dtype, copy=False))
    w.close()
    print(f"F16 base {base.stat().st_size:,d} bytes in {time.time() - t0:.0f} s")
    t0 = time.time()
    quantize(binary, base, dst, "Q4_K_M")
    base.unlink()
    print(f"{dst}: {dst.stat().st_size:,d} bytes ({dst.stat().st_size / 2**20:.0f} MiB) in {time.time() - t0:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, help=f"default {DEFAULT_OUT.relative_to(REPO)}, or {BENCH_OUT.relative_to(REPO)} "
                    "with a --bench-* flag")
    ap.add_argument("--quantize", type=Path, default=DEFAULT_QUANTIZE, help="llama-quantize binary")
    ap.add_argument("--keep-bases", action="store_true", help="also keep the k-tier F16 bases")
    ap.add_argument("--bench-1b", action="store_true", help="write the ~1B benchmark model instead")
    ap.add_argument("--bench-moe", action="store_true", help="write the Qwen3-MoE-shaped benchmark model instead")
    ap.add_argument("--bench-moe-3b", action="store_true",
                    help="write the 3.9 B-total / 0.47 B-active Qwen3-MoE-shaped benchmark model instead")
    ap.add_argument("--bench-mla", action="store_true",
                    help="write the deepseek2 benchmark model with DeepSeek V3's attention size instead")
    ap.add_argument("--families", nargs="*", choices=list(sa.FAMILIES),
                    help="only these families (their manifest entries replaced, the others kept)")
    args = ap.parse_args()
    if not args.quantize.is_file():
        sys.exit(f"llama-quantize not found at {args.quantize} (cmake --build build --target llama-quantize)")
    benches = {"bench_1b": make_bench_1b, "bench_moe": make_bench_moe, "bench_mla": make_bench_mla,
               "bench_moe_3b": make_bench_moe_3b}
    for flag, make in benches.items():
        if getattr(args, flag):
            make(args.out or BENCH_OUT, args.seed, args.quantize)
            return
    args.out = args.out or DEFAULT_OUT
    families = args.families or list(sa.FAMILIES)
    entries = make_fixtures(args.out, args.seed, args.quantize, families, args.keep_bases)
    if args.families:
        old = json.loads((args.out / "manifest.json").read_text())
        if old["seed"] != args.seed:
            sys.exit(f"--families with seed {args.seed}, but manifest.json was made with {old['seed']}")
        fresh = {e["name"]: e for e in entries}
        kept = [e for e in old["fixtures"] if e["family"] not in args.families]
        # the families' order in FAMILIES, as a full run writes them
        order = {f: i for i, f in enumerate(sa.FAMILIES)}
        entries = sorted(kept + list(fresh.values()), key=lambda e: order[e["family"]])
    manifest = {"seed": args.seed, "gguf_py": metadata.version("gguf"), "numpy": np.__version__, "fixtures": entries}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    total = sum(e["bytes"] for e in entries)
    print(f"{len(entries)} fixtures, {total:,d} bytes of GGUF")


if __name__ == "__main__":
    main()
