"""The real `shoal serve` for the conformance step: tests/python's `ShoalNode` (one process on ephemeral
ports, its `url` once it listens), loaded under its own module name so that it never shadows the
`conftest` module of llama.cpp's suite, and one node per set of flags for a whole pytest session."""

import importlib.util
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL_ID = "smollm2-135m-instruct-q4_1"


def _python_conftest():
    spec = importlib.util.spec_from_file_location("shoal_python_conftest", REPO / "tests" / "python" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ShoalNode = _python_conftest().ShoalNode

_nodes: "dict[tuple, ShoalNode]" = {}


def node(*args: str) -> "ShoalNode":
    """A running node started with `args` (started on first use, then shared)."""
    found = _nodes.get(args)
    if found is None or found.proc.poll() is not None:
        found = ShoalNode(*args, key=f"conformance-{len(_nodes)}", threads=os.cpu_count() or 1)
        _nodes[args] = found
    return found


def stop_all() -> None:
    for n in _nodes.values():
        n.kill()
    _nodes.clear()
