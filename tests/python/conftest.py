"""Fixtures: the real `shoal serve` binary on a free port, and an OpenAI client pointed at it.

Environment:
- SHOAL_BIN: path of the binary (default `<repo>/target/debug/shoal`).
- SHOAL_MODELS_DIR: models directory (default `~/.cache/shoal/models`).
- SHOAL_GOLDEN_DIR: reference generations (default `<repo>/../shared/golden`).
"""

import json
import os
import queue
import re
import subprocess
import threading
import time
from pathlib import Path

import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL_ID = "smollm2-135m-instruct-q4_1"
STARTUP_TIMEOUT_S = 60
LISTENING = re.compile(r"^shoal: listening on (http://\S+:\d+)\s*$")


def _binary() -> Path:
    path = Path(os.environ.get("SHOAL_BIN", REPO / "target" / "debug" / "shoal"))
    if not path.is_file():
        pytest.fail(f"shoal binary not found at {path}: run `cargo build` or set SHOAL_BIN", pytrace=False)
    return path


def _models_dir() -> Path:
    return Path(os.environ.get("SHOAL_MODELS_DIR", Path.home() / ".cache" / "shoal" / "models"))


def _pump(stream, lines: "queue.Queue[str | None]") -> None:
    """Copies a pipe into a queue line by line (keeps the pipe drained so the server never blocks)."""
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


@pytest.fixture(scope="session")
def server_url():
    cmd = [str(_binary()), "serve", "--api-port", "0", "--models-dir", str(_models_dir())]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1, cwd=REPO
    )
    out: "queue.Queue[str | None]" = queue.Queue()
    err: "queue.Queue[str | None]" = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, out), daemon=True).start()
    threading.Thread(target=_pump, args=(proc.stderr, err), daemon=True).start()

    def stderr_tail() -> str:
        lines = []
        while not err.empty():
            line = err.get_nowait()
            if line is not None:
                lines.append(line)
        return "".join(lines[-40:])

    url = None
    seen = []
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while url is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(
                    f"`{' '.join(cmd)}` did not print 'shoal: listening on ...' within "
                    f"{STARTUP_TIMEOUT_S} s.\nstdout:\n{''.join(seen)}\nstderr:\n{stderr_tail()}",
                    pytrace=False,
                )
            try:
                line = out.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if line is None:
                proc.wait(timeout=5)
                pytest.fail(
                    f"`{' '.join(cmd)}` exited with {proc.returncode} before listening.\n"
                    f"stdout:\n{''.join(seen)}\nstderr:\n{stderr_tail()}",
                    pytrace=False,
                )
            seen.append(line)
            match = LISTENING.match(line)
            if match:
                url = match.group(1)
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def client(server_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="not-needed", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def golden_chat() -> list:
    golden_dir = Path(os.environ.get("SHOAL_GOLDEN_DIR", REPO.parent / "shared" / "golden"))
    path = golden_dir / "smollm2-135m-q4_1.chat.json"
    if not path.is_file():
        pytest.fail(f"golden file {path} not found: set SHOAL_GOLDEN_DIR", pytrace=False)
    return json.loads(path.read_text())
