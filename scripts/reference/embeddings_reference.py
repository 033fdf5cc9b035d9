#!/usr/bin/env python3
"""Records llama.cpp's embeddings as fixtures for shoal's embedding tests.

For each model (SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M by default) it starts llama.cpp's
`llama-server` on 127.0.0.1 in embedding mode with mean pooling (`--embeddings --pooling mean`: what
llama.cpp needs to serve OpenAI embeddings from a decoder LLM, whose GGUF names no pooling), posts every
text of TEXTS to `/v1/embeddings` (the pooled final hidden states after the output norm, L2-normalized)
and to `/tokenize` with `add_special` (the tokens it embedded: BOS / EOS as the GGUF asks), and writes
crates/shoal-engine/tests/fixtures/embeddings/<name>.json:
  {"model": file name, "pooling": "mean", "inputs": [{"text", "tokens", "prompt_tokens", "embedding"}]}
with the vectors rounded to 6 decimals (the tests compare by cosine similarity). Flash attention is off:
llama.cpp's own flash-attention path rounds differently (measured on Gemma 3: cosine 0.99890 to its
non-flash vectors for the 2-token "Hello", 0.99995 for the long text); shoal's attention agrees with the
non-flash path to ~1e-8.

llama.cpp is not built in CI, so the fixtures are committed; rerun this script after changing TEXTS.
Usage: scripts/reference/embeddings_reference.py [--llama-cpp DIR] [--model NAME=GGUF ...]
(DIR holds `src/` and `build/`, as made by scripts/build-llama-cpp; default $LLAMA_CPP_DIR, else
bench-out/llama.cpp).
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT_DIR = os.path.join(REPO, "crates/shoal-engine/tests/fixtures/embeddings")
MODELS_DIR = os.path.expanduser("~/.cache/shoal/models")
DEFAULT_MODELS = {
    "smollm2": os.path.join(MODELS_DIR, "smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3": os.path.join(MODELS_DIR, "gemma3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf"),
}

TEXTS = [
    "The capital of France is Paris.",
    "Hello",
    "Rust is a systems programming language focused on safety, speed and concurrency.",
    "日本の首都は東京です。 Ça va très bien, merci !",
    # Long enough to be prefilled in several chunks (shoal's batches hold 256 tokens).
    " ".join(f"Sentence number {i} talks about shoals of fish swimming in the sea." for i in range(30)),
]


def helpers():
    """The server helpers of tokenize_reference.py (free_port, post, wait_healthy)."""
    spec = importlib.util.spec_from_file_location("tokref", os.path.join(HERE, "tokenize_reference.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def record(llama_dir, name, model, h):
    server = os.path.join(llama_dir, "build/bin/llama-server")
    port = h.free_port()
    cmd = [server, "-m", model, "-c", "2048", "-b", "2048", "-ub", "2048", "-t", "2",
           "-fa", "off", "--embeddings", "--pooling", "mean", "--host", "127.0.0.1", "--port", str(port)]
    with open(os.path.join(OUT_DIR, f"{name}.server.log"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            h.wait_healthy(port, proc)
            inputs = []
            for text in TEXTS:
                out = h.post(port, "/v1/embeddings", {"input": text, "encoding_format": "float"})
                tokens = h.post(port, "/tokenize", {"content": text, "add_special": True})["tokens"]
                emb = out["data"][0]["embedding"]
                inputs.append({
                    "text": text,
                    "tokens": tokens,
                    "prompt_tokens": out["usage"]["prompt_tokens"],
                    "embedding": [round(v, 6) for v in emb],
                })
        finally:
            proc.kill()
            proc.wait()
    os.remove(os.path.join(OUT_DIR, f"{name}.server.log"))
    path = os.path.join(OUT_DIR, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"model": os.path.basename(model), "pooling": "mean", "inputs": inputs}, f)
        f.write("\n")
    print(f"wrote {path}: {len(inputs)} inputs, dim {len(inputs[0]['embedding'])}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", default=os.environ.get("LLAMA_CPP_DIR",
                                                          os.path.join(REPO, "bench-out/llama.cpp")))
    ap.add_argument("--model", action="append", default=[], help="NAME=GGUF (default: both models)")
    args = ap.parse_args()
    models = dict(m.split("=", 1) for m in args.model) or DEFAULT_MODELS
    os.makedirs(OUT_DIR, exist_ok=True)
    h = helpers()
    for name, model in models.items():
        if not os.path.isfile(model):
            sys.exit(f"model not found: {model}")
        record(args.llama_cpp, name, model, h)


if __name__ == "__main__":
    main()
