"""Fixtures: the real `shoal serve` binary on a free port, and an OpenAI client pointed at it.

Environment:
- SHOAL_BIN: path of the binary (default `<repo>/target/debug/shoal`).
- SHOAL_MODELS_DIR: models directory (default `~/.cache/shoal/models`).
- SHOAL_GOLDEN_DIR: reference generations (default `<repo>/../shared/golden`).
"""

import contextlib
import hashlib
import json
import os
import queue
import re
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path

import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL_ID = "smollm2-135m-instruct-q4_1"
# Gemma 3 270M Q4_K_M: a base model (no chat template), K-quants, sliding-window layers.
GEMMA_ID = "gemma3-270m-q4_k_m"
STARTUP_TIMEOUT_S = 60
LISTENING = re.compile(r"^shoal: listening on (http://\S+:\d+)\s*$")


def _binary() -> Path:
    path = Path(os.environ.get("SHOAL_BIN", REPO / "target" / "debug" / "shoal"))
    if not path.is_file():
        pytest.fail(f"shoal binary not found at {path}: run `cargo build` or set SHOAL_BIN", pytrace=False)
    return path


def _models_dir() -> Path:
    return Path(os.environ.get("SHOAL_MODELS_DIR", Path.home() / ".cache" / "shoal" / "models"))


def models_dir_with(fixtures, prefix: str) -> Path:
    """A fresh models dir holding each synthetic fixture (a manifest entry of
    crates/shoal-model/tests/fixtures/synth) under its name, with the model.json a node reads."""
    synth = REPO / "crates/shoal-model/tests/fixtures/synth"
    models = Path(tempfile.mkdtemp(prefix=prefix))
    for f in fixtures:
        d = models / f["name"]
        d.mkdir()
        data = (synth / f["file"]).read_bytes()
        (d / f["file"]).write_bytes(data)
        (d / "model.json").write_text(json.dumps({
            "id": f["name"], "source": "path", "file": f["file"],
            "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
        }))
    return models


def _pump(stream, lines: "queue.Queue[str | None]") -> None:
    """Copies a pipe into a queue line by line (keeps the pipe drained so the server never blocks)."""
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


LAB = str(REPO / "scripts" / "lab")


@contextlib.contextmanager
def lab_namespaces(count: int, prefix: str, *up_args: str):
    """`count` namespaces of the network lab (`scripts/lab up COUNT UP_ARGS…`, named `prefix0`…), torn down
    after. The lab needs root: without it the test fails with that reason."""
    if os.geteuid() != 0:
        pytest.fail("the lab tests need root (network namespaces): run them as root", pytrace=False)
    subprocess.run([LAB, "down", "--prefix", prefix], check=True, capture_output=True)
    try:
        subprocess.run([LAB, "up", str(count), *up_args, "--prefix", prefix], check=True, capture_output=True)
        yield [f"{prefix}{i}" for i in range(count)]
    finally:
        subprocess.run([LAB, "down", "--prefix", prefix], capture_output=True)


NODE = re.compile(r"^shoal: node (\S+)\s*$")
# Every node started by a test, so a failing test's report shows what the nodes printed.
_NODES: "weakref.WeakSet[ShoalNode]" = weakref.WeakSet()
CLUSTER_ADDR = re.compile(r"^shoal: cluster listening on (\S+)\s*$")


class ShoalNode:
    """One `shoal serve` process on ephemeral ports with its own state dir (its identity survives
    `restart`). `url` is its HTTP API, `id` its node id, `cluster_addr` what other nodes pass to --peer."""

    def __init__(
        self, *args: str, state_dir: "str | None" = None, key: "str | None" = "python-tests", threads: int = 1,
        host: str = "127.0.0.1", netns: "str | None" = None, mdns: bool = False,
        models_dir: "str | Path | None" = None, env: "dict | None" = None, wrap: "list[str] | None" = None,
    ):
        self.args = list(args)
        self.threads = threads
        self.host, self.netns, self.mdns = host, netns, mdns
        self.key = key
        self.models_dir = Path(models_dir) if models_dir else _models_dir()
        self.env = env
        # A command the node runs under (its arguments then follow), e.g. `unshare` with a script.
        self.wrap = list(wrap or [])
        self.state_dir = state_dir or tempfile.mkdtemp(prefix="shoal-test-state-")
        self.proc = None
        self.log: "list[str]" = []
        _NODES.add(self)
        self.start()

    def start(self) -> None:
        self.cmd = [
            str(_binary()), "serve", "--api-host", self.host, "--api-port", "0",
            "--models-dir", str(self.models_dir), "--threads", str(self.threads),
            "--state-dir", self.state_dir, "--cluster-listen", f"{self.host}:0",
            *(["--cluster-key", self.key] if self.key else []), *([] if self.mdns else ["--no-mdns"]),
            *self.args,
        ]
        if self.wrap:
            self.cmd = [*self.wrap, *self.cmd]
        if self.netns:
            self.cmd = ["ip", "netns", "exec", self.netns, *self.cmd]
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1, cwd=REPO,
            env=self.env,
        )
        out: "queue.Queue[str | None]" = queue.Queue()
        self.err: "queue.Queue[str | None]" = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, out), daemon=True).start()
        threading.Thread(target=_pump, args=(self.proc.stderr, self.err), daemon=True).start()
        self.url = self.id = self.cluster_addr = None
        seen = []
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while self.url is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                pytest.fail(
                    f"`{' '.join(self.cmd)}` did not print 'shoal: listening on ...' within "
                    f"{STARTUP_TIMEOUT_S} s.\nstdout:\n{''.join(seen)}\nstderr:\n{self.stderr_tail()}",
                    pytrace=False,
                )
            try:
                line = out.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(timeout=5)
                pytest.fail(
                    f"`{' '.join(self.cmd)}` exited with {self.proc.returncode} before listening.\n"
                    f"stdout:\n{''.join(seen)}\nstderr:\n{self.stderr_tail()}",
                    pytrace=False,
                )
            seen.append(line)
            for pattern, attr in ((LISTENING, "url"), (NODE, "id"), (CLUSTER_ADDR, "cluster_addr")):
                m = pattern.match(line)
                if m and getattr(self, attr) is None:
                    setattr(self, attr, m.group(1))

    def stderr_tail(self, n: int = 40) -> str:
        """The last `n` lines the node wrote to stderr (kept across calls)."""
        while not self.err.empty():
            line = self.err.get_nowait()
            if line is not None:
                self.log.append(line)
        del self.log[:-400]
        return "".join(self.log[-n:])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.fixture
def bounded(request):
    """Fails the test using it once it has run its own `BOUND_S` seconds (an attribute of the test function),
    else its module's (default 120), whatever it waits on (SIGALRM): for tests that hold sockets a node might
    leave hanging."""
    seconds = getattr(request.function, "BOUND_S", None) or getattr(request.module, "BOUND_S", 120)

    def expired(*_):
        raise TimeoutError(f"{request.node.name} ran past its {seconds} s bound")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")
def server_url():
    node = ShoalNode(key="python-tests-single-node", threads=os.cpu_count() or 1)
    try:
        yield node.url
    finally:
        node.kill()


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


@pytest.fixture(scope="session")
def pipeline():
    """Two nodes sharing one instance of the test model: layers 0-14 on `a` (which drives it), 15-29 on `b`
    (whose last stage samples), f32 activations so the pipeline gives the single node's tokens exactly;
    `b` forwards requests to `a`. Shared by every API suite's pipeline test."""
    from test_cluster import place, wait_members

    a = ShoalNode("--no-auto-instance", "--wire-dtype", "f32", key="sdk-pipeline")
    b = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr, key="sdk-pipeline")
    nodes = [a, b]
    try:
        wait_members(nodes, nodes)
        place(a, [(a, 15), (b, 15)])
        yield a, b
    finally:
        for n in nodes:
            n.kill()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test's report carries each node's exit status and the end of its stderr."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for node in list(_NODES):
            if node.proc is None:
                continue
            status = node.proc.poll()
            state = "running" if status is None else f"exited with {status}"
            report.sections.append(
                (f"shoal node {node.id} ({node.url}, {state})", node.stderr_tail(60))
            )
