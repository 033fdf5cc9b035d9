#!/usr/bin/env python3
"""The weight bytes one decoded token reads from a GGUF, by part, and the decode roofline they give.

A token reads every layer's attention and norms, a mixture-of-experts layer's router, shared expert and
`expert_used_count` of its `expert_count` routed experts (each `*_exps` tensor holds `count` equal slices),
the final norm and the output head (the embedding matrix when tied), and one row of the token embedding.
Bytes are the tensors' sizes in the file (Q4_K_M mixes types per layer, so every layer is counted).

usage: scripts/synth/token_bytes.py FILE.gguf [--bandwidth GB/s] [--tok-s T ...]
  --bandwidth: the single-thread read bandwidth (`shoal bench --memory-bandwidth`) -> roofline tok/s;
  --tok-s: measured decode rates, printed as GB/s read and as a share of the roofline.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import gguf


def field(r: gguf.GGUFReader, key: str):
    f = r.get_field(key)
    return None if f is None else f.contents()


def token_bytes(path: Path) -> tuple[dict[str, int], int]:
    """({part: bytes a token reads}, bytes of every tensor)."""
    r = gguf.GGUFReader(str(path))
    arch = field(r, "general.architecture")
    count = field(r, f"{arch}.expert_count") or 0
    used = field(r, f"{arch}.expert_used_count") or 0
    parts = {"attention": 0, "router": 0, "experts": 0, "shared expert": 0, "dense ffn": 0, "norms": 0,
             "head": 0, "embedding row": 0}
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names
    total = 0
    for t in r.tensors:
        n, b = t.name, int(t.n_bytes)
        total += b
        if n == "token_embd.weight":
            rows = int(t.shape[-1])
            parts["embedding row"] += b // rows
            if tied:
                parts["head"] += b
        elif n == "output.weight":
            parts["head"] += b
        elif n.endswith("_exps.weight") or n.endswith("_exps.bias"):
            parts["experts"] += b * used // count
        elif "ffn_gate_inp" in n and "shexp" not in n or n.endswith("exp_probs_b.bias"):
            parts["router"] += b
        elif "shexp" in n:
            parts["shared expert"] += b
        elif n.endswith("norm.weight") or n.endswith("norm.bias"):
            parts["norms"] += b
        elif ".attn_" in n:
            parts["attention"] += b
        elif ".ffn_" in n:
            parts["dense ffn"] += b
        else:
            parts.setdefault("other", 0)
            parts["other"] += b
    return {k: v for k, v in parts.items() if v}, total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path)
    ap.add_argument("--bandwidth", type=float, help="read bandwidth in GB/s (10^9 bytes/s)")
    ap.add_argument("--tok-s", type=float, nargs="*", default=[], help="measured decode tok/s")
    args = ap.parse_args()
    parts, total = token_bytes(args.file)
    per_token = sum(parts.values())
    print(f"{args.file.name}: {os.path.getsize(args.file):,d} bytes on disk, {total:,d} of tensors")
    for k, v in parts.items():
        print(f"  {k:14s} {v / 1e6:9.2f} MB")
    print(f"  {'per token':14s} {per_token / 1e6:9.2f} MB ({per_token / total:.1%} of the tensors)")
    if args.bandwidth:
        roof = args.bandwidth * 1e9 / per_token
        print(f"roofline at {args.bandwidth:.1f} GB/s: {roof:.1f} tok/s")
    for t in args.tok_s:
        gbs = t * per_token / 1e9
        share = f", {t / roof:.0%} of the roofline" if args.bandwidth else ""
        print(f"{t:.1f} tok/s reads {gbs:.1f} GB/s{share}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
