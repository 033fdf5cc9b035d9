#!/usr/bin/env python3
"""Records llama.cpp's tokenization as fixtures for shoal's tokenizer tests.

Two parts, both written under crates/shoal-model/tests/fixtures/tokenize/:

- `gemma3`: starts llama.cpp's `llama-server` on 127.0.0.1 with the Gemma 3 270M GGUF (-c 256 -t 1), posts
  every text of GEMMA_TEXTS to its `/tokenize` endpoint three ways and writes `gemma3.json`:
    plain   add_special=false, parse_special=false  (shoal: `encode(text, false)`)
    special add_special=false, parse_special=true   (shoal: `encode(text, true)`)
    prompt  add_special=true,  parse_special=true   (shoal: `encode_prompt(text)`)
  and `detokenized`, the server's `/detokenize` of the `prompt` ids (each token's piece, control tokens
  rendered).
- `pretok`: compiles a small C++ program against llama.cpp's own `unicode_regex_split` (exported by
  libllama) and writes `pretok.json`: for each BPE pre-tokenizer shoal knows, llama.cpp's regex list
  (copied from `llm_tokenizer_bpe` in src/llama-vocab.cpp) and the pieces llama.cpp splits each of
  PRETOK_TEXTS into.

llama.cpp is not built in CI, so the fixtures are committed; rerun this script after changing the texts.
Usage: scripts/reference/tokenize_reference.py [gemma3|pretok|all] [--llama-cpp DIR] [--model GGUF]
(DIR holds `src/` and `build/`, as made by scripts/build-llama-cpp; default $LLAMA_CPP_DIR, else
bench-out/llama.cpp).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = os.path.join(REPO, "crates/shoal-model/tests/fixtures/tokenize")
DEFAULT_MODEL = os.path.expanduser(
    "~/.cache/shoal/models/gemma3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf")

GEMMA_TEXTS = [
    # empty, spaces
    "",
    " ",
    "Hello world",
    " Hello world",
    "Hello world ",
    "   three leading spaces",
    "trailing spaces   ",
    "a  b   c    d     e",
    " " * 40 + "forty",
    # newlines and tabs
    "\n",
    "\n\n\n",
    "line one\nline two\n\nline four\n",
    "\t",
    "a\tb\t\tc",
    "windows\r\nline\r\n",
    " \n \n ",
    "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    # digits
    "12345",
    "3.14159",
    "1,000,000 and 2024-01-31",
    "x=42;y=-7.5e10",
    "0x1F 0b1010 007",
    # punctuation
    "Hello, world! How's it going? (fine) [ok] {yes} <no>",
    "...!!!???---",
    "\"quoted\" 'single' `back`",
    "it's they're we'll I'd you've she'S",
    "@#$%^&*_+=|\\/~",
    # accents and other scripts
    "café naïve résumé Ångström",
    "cafe\u0301 (combining accent)",
    "Straße, Œuvre, ﬁne ligature, Ⅻ, ½",
    "日本の首都は東京です。",
    "中文测试，标点符号！",
    "한국어 텍스트",
    "Привет, мир!",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    # emoji (byte fallback for the rare ones)
    "🦀🐟",
    "👨‍👩‍👧‍👦 family",
    "🫠🪿🫎",
    "flags 🇫🇷🇯🇵",
    # code
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "def f(x):\n\treturn x**2  # square\n",
    "<div class=\"a\">&nbsp;</div>",
    "SELECT * FROM t WHERE id >= 10;",
    # special tokens (only parsed with parse_special)
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after bos",
    "text<eos>",
    "<start_of_image> and <end_of_image>",
    "<unused5><mask>[multimodal]",
    "<start_of_turn><end_of_turn>",
    "not <start_of_turn special",
    "a</s>b, user-defined in the file but a control token to llama.cpp",
    # rare and unknown-ish characters
    "\ue000 private use",
    "\U0010fffd",
    "\U00013000 hieroglyph",
    "a\u0001b\u007fc",
    "zero\u200bwidth",
    "a\u2581b literal lower-one-eighth block",
    "<0x41> byte token text",
    "\u00a0no-break\u3000ideographic space",
]

# One pre-tokenizer per shoal `PreTokenizerKind`, with llama.cpp's regex list for it (llm_tokenizer_bpe's
# constructor in src/llama-vocab.cpp: LLAMA3, QWEN2, SMOLLM/STARCODER, GPT2 and the default branch).
GPT2_RE = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
PRETOK_REGEXES = {
    "llama-bpe": [
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
        "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    "qwen2": [
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
        "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ],
    "smollm": ["\\p{N}", GPT2_RE],
    "gpt-2": [GPT2_RE],
    "default": [
        "[\\p{P}\\$\\+<=>\\^~\\|]+",
        GPT2_RE,
        "\\p{N}+",
        "[0-9][0-9][0-9]",
    ],
}

PRETOK_TEXTS = [
    "Hello world",
    "   leading spaces and\ttabs\nnewline",
    "trailing   ",
    "a  b\t\t c \n\n d",
    "\n\n\n",
    " \n \r\n\r\n x",
    "12345 1234567 12",
    "3.14159, 1,000,000; -42",
    "٣٤٥ ۱۲۳ ⅫⅩ ½ ²³",
    "it's they're we'll I'd you've",
    "IT'S THEY'RE WE'LL I'D YOU'VE She'S",
    "'s 'tis ''quoted'' rock'n'roll",
    "Hello, world! (fine) [ok] {yes} <no> ...?!",
    "$100 + 5^2 = x|y ~z `code` @home #tag",
    "a+b<=c>>d==e",
    "café naïve Ångström cafe\u0301",
    "日本の首都は東京です。",
    "Привет, мир!",
    "मराठी नमस्ते",
    "🦀🐟 emoji 👨‍👩‍👧‍👦!",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "x\u00a0y\u3000z\u2028w\u0085v",
    "\u0378 unassigned \U000e0001 tag",
    "\ue000private\U0010fffd",
    "a\u0001b\u007fc\u200bd",
    "don't\nstop\r\nbelievin'",
    "  \n  a",
    "...!!!???---",
]

PRETOK_CPP = r"""
// Reads records "name\x1ftext\x1e" on stdin, prints the pieces of each text joined by \x1f, one
// record per \x1e, using llama.cpp's own unicode_regex_split with the regex list named `name`.
#include "unicode.h"
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    // argv: name regex [regex...] -- name regex ...
    std::map<std::string, std::vector<std::string>> lists;
    std::string cur;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--") { cur.clear(); continue; }
        if (cur.empty()) { cur = a; lists[cur]; continue; }
        lists[cur].push_back(a);
    }
    std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    size_t pos = 0;
    while (pos < in.size()) {
        size_t end = in.find('\x1e', pos);
        std::string rec = in.substr(pos, end - pos);
        pos = end + 1;
        size_t sep = rec.find('\x1f');
        const auto & regexes = lists.at(rec.substr(0, sep));
        auto pieces = unicode_regex_split(rec.substr(sep + 1), regexes, false);
        for (size_t i = 0; i < pieces.size(); ++i) {
            if (i) std::cout << '\x1f';
            std::cout << pieces[i];
        }
        std::cout << '\x1e';
    }
    return 0;
}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def wait_healthy(port, proc, deadline_s=120):
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"llama-server exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit("llama-server did not become healthy in time")


def gemma3(llama_dir, model):
    server = os.path.join(llama_dir, "build/bin/llama-server")
    port = free_port()
    cmd = [server, "-m", model, "-c", "256", "-t", "1", "--host", "127.0.0.1", "--port", str(port)]
    log = open(os.path.join(tempfile.gettempdir(), "tokenize_reference.server.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(port, proc)
        cases = []
        for text in GEMMA_TEXTS:
            ids = {}
            for name, add_special, parse_special in [
                ("plain", False, False),
                ("special", False, True),
                ("prompt", True, True),
            ]:
                body = {"content": text, "add_special": add_special, "parse_special": parse_special}
                ids[name] = post(port, "/tokenize", body)["tokens"]
            detok = post(port, "/detokenize", {"tokens": ids["prompt"]})["content"]
            cases.append({"text": text, **ids, "detokenized": detok})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    out = {
        "model": os.path.basename(model),
        "made_by": "scripts/reference/tokenize_reference.py gemma3 (llama-server /tokenize and /detokenize)",
        "cases": cases,
    }
    write_json("gemma3.json", out)


def pretok(llama_dir):
    src = os.path.join(llama_dir, "src/src")
    lib = os.path.join(llama_dir, "build/bin")
    with tempfile.TemporaryDirectory() as tmp:
        cpp = os.path.join(tmp, "split.cpp")
        exe = os.path.join(tmp, "split")
        with open(cpp, "w") as f:
            f.write(PRETOK_CPP)
        subprocess.run(
            ["g++", "-std=c++17", "-O1", "-I", src, cpp, "-o", exe, "-L", lib, "-lllama",
             f"-Wl,-rpath,{lib}"],
            check=True,
        )
        args = []
        for name, regexes in PRETOK_REGEXES.items():
            args += ["--", name, *regexes]
        records = "".join(
            f"{name}\x1f{text}\x1e" for name in PRETOK_REGEXES for text in PRETOK_TEXTS)
        res = subprocess.run([exe, *args], input=records.encode(), capture_output=True, check=True)
    outs = res.stdout.decode().split("\x1e")[:-1]
    it = iter(outs)
    kinds = {}
    for name, regexes in PRETOK_REGEXES.items():
        cases = []
        for text in PRETOK_TEXTS:
            pieces = next(it).split("\x1f") if text else []
            if "".join(pieces) != text:
                sys.exit(f"{name}: pieces of {text!r} do not cover it: {pieces!r}")
            cases.append({"text": text, "pieces": pieces})
        kinds[name] = {"regexes": regexes, "cases": cases}
    out = {
        "made_by": "scripts/reference/tokenize_reference.py pretok (llama.cpp's unicode_regex_split)",
        "pre_tokenizers": kinds,
    }
    write_json("pretok.json", out)


def write_json(name, value):
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="?", default="all", choices=["gemma3", "pretok", "all"])
    ap.add_argument("--llama-cpp", default=os.environ.get(
        "LLAMA_CPP_DIR", os.path.join(REPO, "bench-out/llama.cpp")))
    ap.add_argument("--model", default=DEFAULT_MODEL)
    args = ap.parse_args()
    if args.what in ("gemma3", "all"):
        gemma3(args.llama_cpp, args.model)
    if args.what in ("pretok", "all"):
        pretok(args.llama_cpp)


if __name__ == "__main__":
    main()
