#!/usr/bin/env python3
"""Checks that shoal renders real chat templates byte for byte as llama.cpp does.

For every template of TEMPLATES (files of llama.cpp's `models/templates/`, used locally, never copied into
this repository) and every model of --model (default: SmolLM2, whose tokenizer adds no BOS, and Gemma 3,
whose tokenizer adds one), it
- starts llama.cpp's `llama-server` on 127.0.0.1 with that model and `--chat-template-file T --jinja`,
  reads the BOS/EOS texts the template sees from `/props`, and whether the tokenizer adds BOS/EOS from
  `/tokenize` (with and without `add_special`);
- posts each conversation of CASES to `/apply-template` (`{"messages", "add_generation_prompt"}` in,
  `{"prompt"}` out; a template error is an HTTP error whose message is recorded);
- renders the same conversations with shoal (the example `render_chat` of shoal-model, built once, which calls
  `ChatTemplate::apply` with the same BOS/EOS texts and added specials);
- reports every difference: the first differing byte with both texts around it, or one side's error.

Servers are started one at a time (with TZ=UTC: llama.cpp formats dates in local time, shoal in UTC) and
always killed; the run is bounded (len(TEMPLATES) x len(models)). A template llama-server refuses to load
is reported and skipped. Exit status 1 when anything differs. Llama 3.x templates print today's date:
run it away from midnight.
Usage: scripts/reference/chat_templates_check.py [--llama-cpp DIR] [--model GGUF ...] [--template NAME ...]
[--templates-dir DIR] [--show]
(DIR holds `src/` and `build/`, as made by scripts/build-llama-cpp; default $LLAMA_CPP_DIR, else
bench-out/llama.cpp).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenize_reference import free_port, post, wait_healthy  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS_DIR = os.path.expanduser("~/.cache/shoal/models")
DEFAULT_MODELS = [
    os.path.join(MODELS_DIR, "smollm2-135m-instruct-q4_1/SmolLM2-135M-Instruct.Q4_1.gguf"),
    os.path.join(MODELS_DIR, "gemma3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf"),
]

# The families shoal runs (Gemma 3's template has Gemma 2's shape), plus close relatives.
TEMPLATES = [
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "meta-llama-Llama-3.3-70B-Instruct.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "google-gemma-2-2b-it.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
    "HuggingFaceTB-SmolLM3-3B.jinja",
]

UNICODE = "Ünïcödé ✓ 日本語 🙂 — «quotes» 'single' \"double\"\nsecond line\n\n\tindented\\backslash  "

CASES = [
    {"name": "system+user", "add_generation_prompt": True, "messages": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ]},
    {"name": "user/assistant/user", "add_generation_prompt": True, "messages": [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ]},
    {"name": "system+user/assistant/user", "add_generation_prompt": True, "messages": [
        {"role": "system", "content": "Be kind.\nAnswer briefly."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]},
    {"name": "single user", "add_generation_prompt": True, "messages": [
        {"role": "user", "content": "Hello"},
    ]},
    {"name": "single user, no generation prompt", "add_generation_prompt": False, "messages": [
        {"role": "user", "content": "Hello"},
    ]},
    {"name": "unicode and newlines", "add_generation_prompt": True, "messages": [
        {"role": "system", "content": "  " + UNICODE},
        {"role": "user", "content": "\n" + UNICODE + "\n"},
    ]},
    {"name": "padded content", "add_generation_prompt": True, "messages": [
        {"role": "user", "content": "  padded  \n"},
        {"role": "assistant", "content": "\n  reply \t"},
        {"role": "user", "content": ""},
    ]},
    {"name": "developer role", "add_generation_prompt": True, "messages": [
        {"role": "developer", "content": "Only answer in French."},
        {"role": "user", "content": "Hello"},
    ]},
    {"name": "history with a think block", "add_generation_prompt": True, "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nEasy: four.\n</think>\n\nFour."},
        {"role": "user", "content": "And 3+3?"},
    ]},
    {"name": "two user turns in a row", "add_generation_prompt": True, "messages": [
        {"role": "user", "content": "One"},
        {"role": "user", "content": "Two"},
    ]},
]


def apply_template(port, case):
    body = {"messages": case["messages"], "add_generation_prompt": case["add_generation_prompt"]}
    try:
        return {"prompt": post(port, "/apply-template", body)["prompt"]}
    except urllib.error.HTTPError as e:
        text = e.read().decode("utf-8", "replace")
        try:
            text = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            pass
        return {"error": f"HTTP {e.code}: {text}"}


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as resp:
        return json.loads(resp.read())


def specials(port):
    """BOS/EOS texts as the template sees them, and whether the tokenizer adds each by itself."""
    props = get(port, "/props")
    plain = post(port, "/tokenize", {"content": "a", "add_special": False})["tokens"]
    full = post(port, "/tokenize", {"content": "a", "add_special": True})["tokens"]
    start = full.index(plain[0]) if plain and plain[0] in full else 0
    return {
        "bos": props.get("bos_token", ""),
        "eos": props.get("eos_token", ""),
        "add_bos": start > 0,
        "add_eos": len(full) > start + len(plain),
    }


def llama_cpp_renders(llama_dir, model, template):
    server = os.path.join(llama_dir, "build/bin/llama-server")
    port = free_port()
    cmd = [server, "-m", model, "-c", "256", "-t", "1", "--host", "127.0.0.1", "--port", str(port),
           "--jinja", "--chat-template-file", template]
    log_path = os.path.join(tempfile.gettempdir(), "chat_templates_check.server.log")
    with open(log_path, "w") as log:
        env = dict(os.environ, TZ="UTC")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            try:
                wait_healthy(port, proc)
            except SystemExit as e:
                # llama-server refuses templates it cannot analyse: every conversation is an error.
                return None, [{"error": f"llama-server did not start: {e}"}] * len(CASES)
            sp = specials(port)
            results = [apply_template(port, case) for case in CASES]
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return sp, results


def build_render_chat():
    """Builds the example once and returns its executable (later runs need no build)."""
    out = subprocess.run(
        ["cargo", "build", "-q", "-p", "shoal-model", "--example", "render_chat",
         "--message-format", "json-render-diagnostics"],
        cwd=REPO, capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "render_chat":
            return msg["executable"]
    sys.exit("cargo built no render_chat executable")


def shoal_renders(render_chat, template, sp):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(CASES, f, ensure_ascii=False)
        cases_path = f.name
    try:
        cmd = [render_chat, template, cases_path, "--bos", sp["bos"], "--eos", sp["eos"]]
        if sp["add_bos"]:
            cmd.append("--add-bos")
        if sp["add_eos"]:
            cmd.append("--add-eos")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            # The template itself is refused (does not compile): every conversation is an error.
            return [{"error": out.stderr.strip()}] * len(CASES)
        return json.loads(out.stdout)
    finally:
        os.unlink(cases_path)


def describe(ours, theirs):
    """None when equal, else a short description of the difference."""
    if "prompt" in ours and "prompt" in theirs:
        a, b = ours["prompt"], theirs["prompt"]
        if a == b:
            return None
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        lo = max(0, i - 40)
        return (f"first difference at char {i}\n"
                f"      llama.cpp: {b[lo:i + 60]!r}\n"
                f"      shoal:     {a[lo:i + 60]!r}")
    if "error" in ours and "error" in theirs:
        return None  # both refuse the conversation
    return f"llama.cpp: {str(theirs)[:300]}\n      shoal:     {str(ours)[:300]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", default=os.environ.get(
        "LLAMA_CPP_DIR", os.path.join(REPO, "bench-out/llama.cpp")))
    ap.add_argument("--model", action="append", help="GGUF to serve (repeatable)")
    ap.add_argument("--template", action="append", help="template file name (repeatable)")
    ap.add_argument("--templates-dir", help="where the templates are (default: llama.cpp's models/templates)")
    ap.add_argument("--show", action="store_true", help="print llama.cpp's prompts")
    args = ap.parse_args()
    models = args.model or DEFAULT_MODELS
    names = args.template or TEMPLATES
    tdir = args.templates_dir or os.path.join(args.llama_cpp, "src/models/templates")
    render_chat = build_render_chat()
    print(f"chat_templates_check {datetime.date.today()} llama.cpp {args.llama_cpp}")
    differences = 0
    for model in models:
        for name in names:
            template = os.path.join(tdir, name)
            sp, theirs = llama_cpp_renders(args.llama_cpp, model, template)
            if sp is None:
                print(f"{name} with {os.path.basename(model)}: llama.cpp refuses it ({theirs[0]['error']})")
                continue
            ours = shoal_renders(render_chat, template, sp)
            bad = []
            for case, o, t in zip(CASES, ours, theirs):
                d = describe(o, t)
                if args.show:
                    print(f"  --- {case['name']}: {t}")
                if d:
                    bad.append(f"    {case['name']}: {d}")
            refused = sum("error" in t for t in theirs)
            status = "MATCH" if not bad else f"{len(bad)} DIFFERENCES"
            print(f"{name} with {os.path.basename(model)} (bos {sp['bos']!r} added={sp['add_bos']}, "
                  f"eos {sp['eos']!r} added={sp['add_eos']}): {status} "
                  f"({len(CASES)} conversations, {refused} refused by both)" if not bad else
                  f"{name} with {os.path.basename(model)}: {status}")
            for line in bad:
                print(line)
            differences += len(bad)
    print(f"{differences} differences")
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
