#!/usr/bin/env python3
"""Records llama.cpp's outputs for the synthetic fixtures into <name>.ref.json next to each GGUF.

Builds scripts/synth/ref_logits.cpp against a llama.cpp tree (--llama-cpp, default /work/llama.cpp: headers under
src/, libllama.so under build/bin) into target/synth/, then for every fixture in manifest.json runs it with the
fixture's prompt (1 thread, context 64, the whole prompt in one batch, default f16 KV cache) and writes:
- `logits`: every prompt position's logits (6 significant digits),
- `greedy`: N_GEN greedy continuation steps, each the picked token and the top 5 (id, logit) it was picked from,
- `tokenize`: llama_tokenize's ids for the fixture's texts (add_special and parse_special as recorded),
and prints per-fixture statistics (logit range, top-1 minus top-2 gaps) so degenerate weights show up.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "crates/shoal-model/tests/fixtures/synth"
SOURCE = Path(__file__).resolve().parent / "ref_logits.cpp"
N_GEN = 8
LLAMA_CPP_SOURCE = "llama.cpp as vendored in llama-cpp-python 0.3.36 (scripts/build-llama-cpp), CPU build"


def build(llama: Path) -> Path:
    out = REPO / "target/synth/ref_logits"
    if out.is_file() and out.stat().st_mtime > SOURCE.stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    lib = llama / "build/bin"
    cmd = ["g++", "-O2", "-std=c++17", str(SOURCE), f"-I{llama / 'src/include'}", f"-I{llama / 'src/ggml/include'}",
           f"-L{lib}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}", "-o", str(out)]
    subprocess.run(cmd, check=True)
    return out


def requests(entry: dict) -> list[tuple[str, bool, bool]]:
    """(text, add_special, parse_special): every text with both flags on, the last (special-token) text also
    with parse_special off."""
    texts = entry["texts"]
    return [(t, True, True) for t in texts] + [(texts[-1], True, False)]


def run(binary: Path, gguf: Path, entry: dict) -> tuple[dict, str]:
    lines = [" ".join(str(t) for t in entry["prompt"])]
    reqs = requests(entry)
    lines += [f"T {int(a)} {int(p)} {t.encode('utf-8').hex()}" for t, a, p in reqs]
    res = subprocess.run([str(binary), str(gguf), str(N_GEN)], input="\n".join(lines) + "\n",
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"ref_logits failed on {gguf.name}:\n{res.stderr[-3000:]}")
    logits: list[list[float]] = []
    greedy, toks, info = [], [], []
    n_vocab = 0
    for line in res.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "V":
            n_vocab = int(rest)
        elif tag == "L":
            vals = rest.split()
            assert int(vals[0]) == len(logits)
            logits.append([float(v) for v in vals[1:]])
        elif tag == "G":
            vals = rest.split()
            top = [(int(a), float(b)) for a, b in (v.split(":") for v in vals[2:])]
            greedy.append({"token": int(vals[1]), "top5": top})
        elif tag == "T":
            vals = rest.split()
            text, add, parse = reqs[int(vals[0])]
            toks.append({"text": text, "add_special": add, "parse_special": parse, "ids": [int(v) for v in vals[1:]]})
        elif tag == "I":
            info.append(rest.split(": ", 1)[-1])
    assert len(logits) == len(entry["prompt"]) and all(len(r) == n_vocab for r in logits)
    ref = {
        "fixture": entry["file"], "family": entry["family"], "arch": entry["arch"], "tier": entry["tier"],
        "ftype": entry["ftype"], "n_vocab": n_vocab,
        "llama_cpp": {"source": LLAMA_CPP_SOURCE, "n_threads": 1, "n_ctx": 64, "n_batch": 64, "type_k": "f16",
                      "type_v": "f16", "log": sorted(set(info))},
        "prompt": entry["prompt"], "logits": logits, "greedy": greedy, "tokenize": toks,
    }
    return ref, res.stderr


def g6(x: float) -> float:
    return float(f"{x:.6g}")


def dump(ref: dict) -> str:
    """Readable but compact JSON: one logits row per line, floats at 6 significant digits."""
    head = {k: v for k, v in ref.items() if k not in ("logits", "greedy", "tokenize")}
    parts = [json.dumps(head, ensure_ascii=False)[:-1]]
    rows = ",\n".join(json.dumps([g6(x) for x in row], separators=(",", ":")) for row in ref["logits"])
    parts.append(f',\n"logits":[\n{rows}],\n"greedy":[\n')
    parts.append(",\n".join(json.dumps({"token": g["token"], "top5": [[i, g6(v)] for i, v in g["top5"]]},
                                       separators=(",", ":")) for g in ref["greedy"]))
    parts.append('],\n"tokenize":[\n')
    parts.append(",\n".join(json.dumps(t, ensure_ascii=False, separators=(",", ":")) for t in ref["tokenize"]))
    parts.append("]}\n")
    return "".join(parts)


def stats(ref: dict) -> dict:
    lg = np.array(ref["logits"], dtype=np.float64)
    top2 = np.sort(lg, axis=1)[:, -2:]
    gaps = top2[:, 1] - top2[:, 0]
    argmax = lg.argmax(axis=1)
    prompt = np.array(ref["prompt"])
    greedy = [g["token"] for g in ref["greedy"]]
    ggaps = [g["top5"][0][1] - g["top5"][1][1] for g in ref["greedy"]]
    return {"min": lg.min(), "max": lg.max(), "std": lg.std(axis=1).mean(), "gap_mean": gaps.mean(),
            "gap_min": gaps.min(), "self_top1": float((argmax == prompt).mean()),
            "distinct_top1": len(set(argmax.tolist())), "greedy": greedy, "greedy_gap_min": min(ggaps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", type=Path, default=FIXTURES, help="folder with manifest.json and the GGUFs")
    ap.add_argument("--llama-cpp", type=Path, default=Path("/work/llama.cpp"))
    ap.add_argument("--only", nargs="*", help="fixture names")
    args = ap.parse_args()
    binary = build(args.llama_cpp)
    manifest = json.loads((args.fixtures / "manifest.json").read_text())
    print(f"{'fixture':22s} {'min':>7s} {'max':>7s} {'std':>5s} {'gap':>5s} {'gapmin':>6s} {'self':>4s} "
          f"{'uniq':>4s}  greedy")
    failed = []
    for entry in manifest["fixtures"]:
        if args.only and entry["name"] not in args.only:
            continue
        try:
            ref, stderr = run(binary, args.fixtures / entry["file"], entry)
        except RuntimeError as e:
            failed.append(entry["name"])
            print(e, file=sys.stderr)
            continue
        (args.fixtures / f"{entry['name']}.ref.json").write_text(dump(ref))
        s = stats(ref)
        warn = " | " + " ".join(stderr.split()) if stderr.strip() else ""
        print(f"{entry['name']:22s} {s['min']:7.2f} {s['max']:7.2f} {s['std']:5.2f} {s['gap_mean']:5.2f} "
              f"{s['gap_min']:6.3f} {s['self_top1']:4.2f} {s['distinct_top1']:4d}  {s['greedy']}{warn[:160]}")
    if failed:
        sys.exit(f"llama.cpp refused: {failed}")


if __name__ == "__main__":
    main()
