"""Hostile model names through the real binary (issue 26, items 1, 3 and 8): a sweep of every route and
command that takes a model name with `..`, `../x`, `/etc/passwd`, an empty name, NUL, 64 KiB and a folder
of the models dir that is a symbolic link to a canary folder outside it. Every one is refused (a 4xx in
the route's error shape, a non-zero exit with a message), nothing outside the models directory is
written or deleted (the canary files next to the models dir and behind the link keep their bytes and
modification times, nothing new appears), and the node keeps serving (`/health`).

Needs SHOAL_BIN (or target/debug/shoal) and the SmolLM2 gguf (SHOAL_TEST_MODEL, else the models dir's
catalog copy), linked into a temporary models dir. NUL cannot travel in a command-line argument, so the
commands are swept without it (the routes get it).
"""

import json
import os
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import MODEL_ID, REPO, ShoalNode, _binary
from test_store import smollm2_file

HOSTILE = ["..", "../x", "../canary.txt", "/etc/passwd", "", "\0", "a\0b", "x" * 65536, "evil"]
ROUTES_WITH_A_BODY = [
    ("POST", "/api/pull", lambda n: {"model": n, "stream": False}),
    ("DELETE", "/api/delete", lambda n: {"model": n}),
    ("POST", "/api/show", lambda n: {"model": n}),
    ("POST", "/downloads", lambda n: {"model": n}),
    ("POST", "/downloads", lambda n: {"model": "m", "node": n}),
    ("POST", "/v1/chat/completions", lambda n: {"model": n, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/completions", lambda n: {"model": n, "prompt": "hi", "max_tokens": 1}),
    ("POST", "/v1/embeddings", lambda n: {"model": n, "input": "hi"}),
    ("POST", "/v1/responses", lambda n: {"model": n, "input": "hi", "max_output_tokens": 1}),
    ("POST", "/v1/messages", lambda n: {"model": n, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/api/generate", lambda n: {"model": n, "prompt": "hi", "stream": False}),
    ("POST", "/api/chat", lambda n: {"model": n, "stream": False, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/api/embed", lambda n: {"model": n, "input": "hi"}),
]


def snapshot(root: Path, skip: Path) -> dict:
    """Every path under `root` but inside `skip` (the models dir): its bytes (files) and mtime, not
    following links."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d != skip]
        for name in dirnames + filenames:
            p = here / name
            st = p.lstat()
            data = p.read_bytes() if p.is_file() and not p.is_symlink() else None
            out[str(p)] = (st.st_mtime_ns, data)
    return out


@pytest.fixture
def layout(tmp_path):
    """`<tmp>/models` holding SmolLM2 (a link) and `evil` → `<tmp>/outside` (what a model folder holds),
    `<tmp>/canary.txt`, `<tmp>/canary/keep.gguf`; the environment of a command on it (no reachable hub)."""
    models = tmp_path / "models"
    (models / MODEL_ID).mkdir(parents=True)
    (models / MODEL_ID / smollm2_file().name).symlink_to(smollm2_file())
    (tmp_path / "canary.txt").write_text("canary")
    (tmp_path / "canary").mkdir()
    (tmp_path / "canary" / "keep.gguf").write_bytes(b"GGUF keep")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.json").write_text(json.dumps({"id": "evil", "source": "path", "file": "x.gguf", "size": 4}))
    (outside / "x.gguf").write_bytes(b"GGUF")
    (outside / "x.gguf.partial").write_bytes(b"part")
    (models / "evil").symlink_to(outside)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(SHOAL_MODELS_DIR=str(models), HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9")
    return tmp_path, models, env


def call(url: str, method: str, path: str, body=None, timeout: float = 30):
    """(status, parsed JSON or text) of one request; an HTTP error is an answer too."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def assert_refused(status, body, what: str) -> None:
    assert 400 <= status < 500, f"{what}: {status} {str(body)[:300]}"
    if isinstance(body, dict) and "error" in body:
        err = body["error"]
        message = err if isinstance(err, str) else err.get("message")
        assert message, f"{what}: {body}"


def test_hostile_names_touch_nothing_outside_the_models_dir(layout):
    root, models, env = layout
    before = snapshot(root, models)
    state = tempfile.mkdtemp(prefix="shoal-test-state-")
    node = ShoalNode(key="hostile-names", models_dir=models, env=env, state_dir=state)
    try:
        for name in HOSTILE:
            short = repr(name[:12])
            for method, path, body in ROUTES_WITH_A_BODY:
                status, answer = call(node.url, method, path, body(name))
                assert_refused(status, answer, f"{method} {path} {short}")
            quoted = urllib.parse.quote(name, safe="")
            for path in (f"/downloads/{quoted}", f"/downloads/{quoted}?node=x", f"/downloads/m?node={quoted}"):
                status, answer = call(node.url, "DELETE", path)
                assert_refused(status, answer, f"DELETE {path[:40]}")
            status, answer = call(node.url, "GET", f"/v1/models/{quoted}")
            assert_refused(status, answer, f"GET /v1/models/{short}")
            assert call(node.url, "GET", "/health")[0] == 200, f"after {short}"
        # The item 8 requests, raw: refused before any peer is asked.
        for path in ("/downloads/..%2Finstance%2Fabc?node=x", "/downloads/..%2F..%2Fstate?node=x", "/downloads/.."):
            status, answer = call(node.url, "DELETE", path)
            assert status == 400, (path, status, answer)

        # Item 3: no file-existence oracle. A path answers the same whether or not the file is there.
        for path in ("/api/pull", "/downloads"):
            answers = []
            for f in (root / "canary" / "keep.gguf", root / "canary" / "gone.gguf"):
                body = {"model": str(f), "stream": False} if path == "/api/pull" else {"model": str(f)}
                status, answer = call(node.url, "POST", path, body)
                answers.append((status, json.dumps(answer).replace(str(f), "NAME")))
            assert answers[0] == answers[1], answers
            assert answers[0][0] == 400, answers
        status, listing = call(node.url, "GET", "/downloads")
        assert status == 200 and not any(listing["nodes"].values()), listing

        # Every command that takes a model name.
        for name in [n for n in HOSTILE if "\0" not in n]:
            for args in (
                ["rm", name],
                ["rm", "--purge", name],
                ["pull", name],
                ["chat", "--model", name, "hi"],
                ["serve", "--model", name, "--api-port", "0", "--state-dir", state, "--no-mdns",
                 "--cluster-listen", "127.0.0.1:0"],
            ):
                p = subprocess.run([str(_binary()), *args], env=env, capture_output=True, text=True,
                                   timeout=60, cwd=REPO)
                what = f"shoal {args[0]} {name[:12]!r}"
                assert p.returncode != 0, f"{what}: {p.stdout} {p.stderr}"
                assert "model" in p.stderr or "evil" in p.stderr, f"{what}: {p.stderr[-500:]}"
                assert p.stdout == "", f"{what}: {p.stdout}"

        assert call(node.url, "GET", "/health")[0] == 200
        status, tags = call(node.url, "GET", "/api/tags")
        assert status == 200 and [m["name"] for m in tags["models"]] == [MODEL_ID], tags
    finally:
        node.kill()
    assert snapshot(root, models) == before
    assert (models / "evil").is_symlink() and (models / MODEL_ID / smollm2_file().name).exists()
