#!/usr/bin/env python3
"""Checks that the committed synthetic fixtures are exactly what make_models.py writes (determinism).

Re-runs make_models.py with the committed manifest's seed into a temporary folder and compares every GGUF and
manifest.json byte for byte with the committed ones; also checks that every fixture has a <name>.ref.json made
for the same file and prompt. Needs the same llama-quantize (--quantize, as make_models.py), gguf and numpy
versions the README names. Exit status 1 on any difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FIXTURES = REPO / "crates/shoal-model/tests/fixtures/synth"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Fixtures made from committed ones by their own scripts, not by make_models.py (not compared here).
DERIVED = {
    "qwen3-think-s-f16.gguf": "think_fixture.py",
    "qwen3-harmony-s-f16.gguf": "harmony_fixture.py",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", type=Path, default=FIXTURES)
    ap.add_argument("--quantize", type=Path, help="llama-quantize binary (make_models.py's default if omitted)")
    args = ap.parse_args()
    manifest = json.loads((args.fixtures / "manifest.json").read_text())
    problems = []
    with tempfile.TemporaryDirectory(prefix="synth-check-") as tmp:
        cmd = [sys.executable, str(HERE / "make_models.py"), "--seed", str(manifest["seed"]), "--out", tmp]
        if args.quantize:
            cmd += ["--quantize", str(args.quantize)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        fresh = {p.name for p in Path(tmp).iterdir()}
        committed = {p.name for p in args.fixtures.iterdir()
                     if (p.suffix == ".gguf" or p.name == "manifest.json") and p.name not in DERIVED}
        for name in sorted(fresh | committed):
            if name not in committed:
                problems.append(f"{name}: written by make_models.py but not committed")
            elif name not in fresh:
                problems.append(f"{name}: committed but no longer written by make_models.py")
            elif digest(Path(tmp) / name) != digest(args.fixtures / name):
                problems.append(f"{name}: differs from a fresh make_models.py run")
    for entry in manifest["fixtures"]:
        ref_path = args.fixtures / f"{entry['name']}.ref.json"
        if not ref_path.is_file():
            problems.append(f"{ref_path.name}: missing (run reference.py)")
            continue
        ref = json.loads(ref_path.read_text())
        if ref["fixture"] != entry["file"] or ref["prompt"] != entry["prompt"]:
            problems.append(f"{ref_path.name}: made for another file or prompt (run reference.py)")
    for p in problems:
        print(p)
    n = len(manifest["fixtures"])
    if problems:
        sys.exit(f"{len(problems)} problem(s) in {n} fixtures")
    print(f"{n} fixtures and manifest.json are byte-identical to a fresh run; every fixture has its reference")


if __name__ == "__main__":
    main()
