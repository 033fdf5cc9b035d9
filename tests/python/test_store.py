"""The model store through the real binary against scripts/fakehub (the hub's URL layout and headers on
127.0.0.1): a pull killed half way resumes with only the rest (the request log shows the Range), Ctrl-C
cancels cleanly, `shoal models` / `shoal rm` outputs, offline mode, and `shoal serve --model
org/repo:Q4_K_M` answering a chat request with the SmolLM2 file served by fakehub.

Needs SHOAL_BIN (or target/debug/shoal: `cargo build -p shoal`) and, for the serve test, the SmolLM2 gguf
(SHOAL_TEST_MODEL, else the models dir's catalog copy).
"""

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import LISTENING, REPO, _binary, _models_dir, _pump

FAKEHUB = REPO / "scripts" / "fakehub"


class FakeHub:
    def __init__(self, root: Path, *args: str):
        self.root = root
        self.log = root.parent / f"{root.name}.requests.jsonl"
        root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, str(FAKEHUB), "--root", str(root), "--log", str(self.log), *args],
            stdout=subprocess.PIPE, text=True,
        )
        line = self.proc.stdout.readline().strip()
        assert line.startswith("fakehub: listening on "), line
        self.url = line.removeprefix("fakehub: listening on ")

    def add(self, repo: str, name: str, data: bytes) -> Path:
        p = self.root / repo / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return p

    def requests(self) -> list:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def content_gets(self) -> list:
        return [r for r in self.requests() if r["method"] == "GET" and r["path"].startswith("/cdn/")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def hubs(tmp_path):
    started = []

    def start(*args):
        h = FakeHub(tmp_path / f"hub{len(started)}", *args)
        started.append(h)
        return h

    yield start
    for h in started:
        h.stop()


def shoal_env(tmp_path: Path, hub: "FakeHub | None") -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HOME"] = str(tmp_path / "hf")
    env["SHOAL_MODELS_DIR"] = str(tmp_path / "models")
    env["HF_ENDPOINT"] = hub.url if hub else "http://127.0.0.1:9"
    return env


def shoal(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(_binary()), *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def random_bytes(n: int, seed: int) -> bytes:
    out, block = bytearray(), hashlib.sha256(str(seed).encode()).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:n])


def incomplete_size(tmp_path: Path) -> int:
    found = list((tmp_path / "hf" / "hub").glob("models--*/blobs/*.incomplete"))
    return found[0].stat().st_size if found else 0


def wait_for_bytes(proc, tmp_path: Path, at_least: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = incomplete_size(tmp_path)
        if n >= at_least:
            return n
        assert proc.poll() is None, f"pull ended early: {proc.returncode} {proc.stderr.read()}"
        time.sleep(0.05)
    pytest.fail(f"no {at_least} bytes within {timeout} s (have {incomplete_size(tmp_path)})")


def test_a_killed_pull_resumes_with_only_the_rest(tmp_path, hubs):
    size = 8_000_000
    data = random_bytes(size, 1)
    hub = hubs("--rate", "2000000")
    hub.add("org/Resume-GGUF", "Resume-Q4_K_M.gguf", data)
    hub.add("org/Resume-GGUF", "README.md", b"# resume\n")
    env = shoal_env(tmp_path, hub)
    cmd = [str(_binary()), "pull", "org/Resume-GGUF:Q4_K_M"]

    # Ctrl-C: a clean cancel, the partial kept, a message that says the next pull resumes.
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_bytes(p, tmp_path, 1_500_000)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, (p.returncode, err)
    assert "cancelled" in err and "resume" in err, err
    assert out == ""
    after_cancel = incomplete_size(tmp_path)
    assert 1_500_000 <= after_cancel < size
    models = shoal(env, "models")
    assert models.returncode == 0, models.stderr
    line = next(l for l in models.stdout.splitlines() if l.startswith("org/Resume-GGUF:Q4_K_M"))
    assert "hub" in line and "partial" in line, line

    # Killed outright half way: the bytes on disk stay.
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_bytes(p, tmp_path, size // 2)
    p.kill()
    p.wait(timeout=10)
    have = incomplete_size(tmp_path)
    assert size // 2 <= have < size

    done = shoal(env, "pull", "org/Resume-GGUF:Q4_K_M")
    assert done.returncode == 0, done.stderr
    model_id, path = done.stdout.strip().split(": ", 1)
    assert model_id == "org/Resume-GGUF:Q4_K_M"
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    # Progress lines on a non-terminal stderr: bytes, speed, ETA.
    assert "downloading" in done.stderr and "MiB/s" in done.stderr, done.stderr

    deadline = time.monotonic() + 10  # a request is logged just after its last byte went out
    while len(hub.content_gets()) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    gets = hub.content_gets()
    ranged = [g["range"] for g in gets if g["range"]]
    assert ranged == [f"bytes={after_cancel}-", f"bytes={have}-"], gets
    last = next(g for g in gets if g["range"] == f"bytes={have}-")
    assert (last["status"], last["bytes"]) == (206, size - have)
    assert incomplete_size(tmp_path) == 0
    models = shoal(env, "models")
    line = next(l for l in models.stdout.splitlines() if l.startswith("org/Resume-GGUF:Q4_K_M"))
    assert line.split()[-1] == "complete", line


def test_models_lists_every_folder_and_rm_deletes_one(tmp_path, hubs):
    hub = hubs()
    hub.add("org/Two-GGUF", "Two-Q4_K_M.gguf", random_bytes(1_048_576, 2))
    hub.add("org/Two-GGUF", "Two-Q8_0.gguf", random_bytes(2_097_152, 3))
    env = shoal_env(tmp_path, hub)
    for name in ("org/Two-GGUF:Q4_K_M", "org/Two-GGUF:Q8_0"):
        r = shoal(env, "pull", name)
        assert r.returncode == 0, r.stderr
    # A folder a user dropped a gguf in, and an interrupted catalog download.
    mine = tmp_path / "models" / "my-own-model"
    mine.mkdir()
    (mine / "weights.gguf").write_bytes(b"GGUF" + bytes(3 * 1048576 - 4))
    cat = tmp_path / "models" / "smollm2-135m-instruct-q4_1"
    cat.mkdir()
    (cat / "SmolLM2-135M-Instruct.Q4_1.gguf.partial").write_bytes(bytes(1048576))

    r = shoal(env, "models")
    assert r.returncode == 0, r.stderr
    rows = {l.split()[0]: l.split()[1:] for l in r.stdout.splitlines()}
    assert rows == {
        "my-own-model": ["3.0", "MiB", "path", "complete"],
        "org/Two-GGUF:Q4_K_M": ["1.0", "MiB", "hub", "complete"],
        "org/Two-GGUF:Q8_0": ["2.0", "MiB", "hub", "complete"],
        "smollm2-135m-instruct-q4_1": ["93.8", "MiB", "catalog", "partial", "1.0", "MiB", "of", "93.8", "MiB", "(1%)"],
    }, r.stdout

    blobs = tmp_path / "hf" / "hub" / "models--org--Two-GGUF" / "blobs"
    assert len(list(blobs.iterdir())) == 2
    r = shoal(env, "rm", "org/Two-GGUF:Q4_K_M")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"removed {tmp_path / 'models' / 'org--Two-GGUF--Q4_K_M'}"
    assert len(list(blobs.iterdir())) == 2, "the HF cache is left alone without --purge"
    r = shoal(env, "rm", "--purge", "org/Two-GGUF:Q8_0")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 3, r.stdout
    assert len(list(blobs.iterdir())) == 1
    r = shoal(env, "rm", "my-own-model")
    assert r.returncode == 0 and not mine.exists()
    r = shoal(env, "models")
    assert [l.split()[0] for l in r.stdout.splitlines()] == ["smollm2-135m-instruct-q4_1"]
    r = shoal(env, "rm", "org/Two-GGUF:Q8_0")
    assert r.returncode != 0 and "not present" in r.stderr, r.stderr


def test_offline_uses_only_complete_files(tmp_path, hubs):
    hub = hubs()
    data = random_bytes(1_000_000, 4)
    hub.add("org/Off-GGUF", "Off-Q8_0.gguf", data)
    env = shoal_env(tmp_path, hub)
    r = shoal(env, "pull", "--offline", "org/Off-GGUF:Q8_0")
    assert r.returncode != 0
    assert "offline" in r.stderr and str(tmp_path / "hf" / "hub" / "models--org--Off-GGUF") in r.stderr, r.stderr
    r = shoal({**env, "HF_HUB_OFFLINE": "1"}, "pull", "org/Off-GGUF:Q8_0")
    assert r.returncode != 0 and "offline" in r.stderr, r.stderr
    assert hub.requests() == []
    assert shoal(env, "pull", "org/Off-GGUF:Q8_0").returncode == 0
    hub.stop()
    # A fresh models dir, the hub down: the HF cache has it.
    r = shoal({**env, "HF_HUB_OFFLINE": "1", "SHOAL_MODELS_DIR": str(tmp_path / "m2")}, "pull", "org/Off-GGUF:Q8_0")
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip().split(": ", 1)[1]).read_bytes() == data


def smollm2_file() -> Path:
    p = os.environ.get("SHOAL_TEST_MODEL")
    path = Path(p) if p else _models_dir() / "smollm2-135m-instruct-q4_1" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.fail(f"SmolLM2 gguf not found at {path}: run `shoal pull` or set SHOAL_TEST_MODEL", pytrace=False)
    return path


def test_serve_a_hub_model_by_its_quant_tag(tmp_path, hubs):
    hub = hubs()
    # The SmolLM2 file under a Q4_K_M name: what matters here is the tag resolution and the download.
    repo = hub.root / "org" / "SmolLM2-GGUF"
    repo.mkdir(parents=True)
    (repo / "SmolLM2-135M-Instruct-Q4_K_M.gguf").symlink_to(smollm2_file())
    (repo / "README.md").write_text("# smol\n")
    env = shoal_env(tmp_path, hub)
    model = "org/SmolLM2-GGUF:Q4_K_M"
    proc = subprocess.Popen(
        [str(_binary()), "serve", "--model", model, "--api-host", "127.0.0.1", "--api-port", "0",
         "--threads", "1", "--state-dir", str(tmp_path / "state"), "--cluster-listen", "127.0.0.1:0",
         "--cluster-key", "store-test", "--no-mdns"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
    )
    out: "queue.Queue[str | None]" = queue.Queue()
    err: "queue.Queue[str | None]" = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, out), daemon=True).start()
    threading.Thread(target=_pump, args=(proc.stderr, err), daemon=True).start()
    try:
        url, deadline = None, time.monotonic() + 180
        while url is None and time.monotonic() < deadline:
            try:
                line = out.get(timeout=1)
            except queue.Empty:
                continue
            assert line is not None, f"serve exited: {proc.wait()} {list(err.queue)[-20:]}"
            m = LISTENING.match(line)
            url = m.group(1) if m else None
        assert url, "serve did not listen in time"
        body = json.dumps({
            "model": model, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
        }).encode()
        req = urllib.request.Request(f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.load(r)
        assert answer["model"] == model
        assert answer["choices"][0]["message"]["content"].strip(), answer
        assert answer["usage"]["completion_tokens"] > 0
        models = json.load(urllib.request.urlopen(f"{url}/v1/models", timeout=30))
        assert model in [m["id"] for m in models["data"]], models
    finally:
        proc.kill()
        proc.wait(timeout=10)
    link = tmp_path / "models" / "org--SmolLM2-GGUF--Q4_K_M" / "SmolLM2-135M-Instruct-Q4_K_M.gguf"
    assert link.is_symlink() and link.resolve().read_bytes()[:4] == b"GGUF"
