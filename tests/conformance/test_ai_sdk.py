"""Vercel's AI SDK (the `ai` npm package) against a real shoal, through its OpenAI-compatible, Anthropic and
Ollama providers: `generateText`, `streamText`, `generateObject` and `generateText`'s `Output.object` with
a zod schema, and one tool-calling step with a zod input schema. ai-sdk/calls.mjs makes the calls and
prints what came back, one JSON line per call; the assertions are here.

The packages are pinned by ai-sdk/package.json and package-lock.json (committed without the lock's
`resolved` URLs: npm takes each package from the configured registry and checks its integrity hash) and
installed with `npm ci` once per lock into the conformance cache (`~/.cache/shoal/conformance`, see
suite.py), never into the repository. Node and npm are scripts/test's to install."""

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import suite
from conftest import MODEL
from tools import Person, check_weather_args

HERE = Path(__file__).resolve().parent / "ai-sdk"
PACKAGE_FILES = ("package.json", "package-lock.json")
SCRIPT = "calls.mjs"
TIMEOUT_S = 300
PROVIDERS = ["openai_compatible", "anthropic", "ollama"]
MAX_TOKENS = 48  # calls.mjs's cap of the text calls


def _install() -> Path:
    """A folder holding the locked packages' node_modules (installed once per lock) and calls.mjs."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.fail(f"`{tool}` not found: the AI SDK tests need Node.js and npm (scripts/test installs them)",
                        pytrace=False)
    digest = hashlib.sha256(b"".join((HERE / f).read_bytes() for f in PACKAGE_FILES)).hexdigest()[:16]
    root = suite.cache_dir()
    target = root / f"ai-sdk-{digest}"
    if not (target / "node_modules" / "ai" / "package.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="ai-sdk-", dir=root))
        try:
            for f in PACKAGE_FILES:
                shutil.copy(HERE / f, staging / f)
            p = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
                               cwd=staging, capture_output=True, text=True, timeout=TIMEOUT_S)
            assert p.returncode == 0, f"npm ci failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    shutil.copy(HERE / SCRIPT, target / SCRIPT)  # ES modules resolve packages from the script's folder
    return target


@pytest.fixture(scope="module")
def results(shoal_url) -> "dict[tuple[str, str], dict]":
    """(provider, call) -> what calls.mjs printed for that call."""
    folder = _install()
    p = subprocess.run(["node", SCRIPT, shoal_url, MODEL], cwd=folder, capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    assert p.returncode == 0, f"node {SCRIPT} exited with {p.returncode}:\n{p.stderr}"
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    return {(r["provider"], r["call"]): r for r in lines}


def _result(results, provider: str, call: str) -> dict:
    r = results.get((provider, call))
    assert r is not None, f"calls.mjs printed nothing for {provider} {call}"
    assert "error" not in r, f"{provider} {call} failed: {r}"
    return r


def _check_usage(r: dict, max_tokens: int) -> None:
    assert r["usage"]["inputTokens"] and r["usage"]["inputTokens"] > 0, r
    assert r["usage"]["outputTokens"] and 0 < r["usage"]["outputTokens"] <= max_tokens, r


@pytest.mark.parametrize("provider", PROVIDERS)
def test_generate_text(results, provider):
    r = _result(results, provider, "generateText")
    assert r["text"].strip(), r
    assert r["finishReason"] in ("stop", "length"), r
    _check_usage(r, MAX_TOKENS)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_stream_text(results, provider):
    r = _result(results, provider, "streamText")
    assert r["chunks"] > 1 and r["text"].strip(), r
    assert r["finishReason"] in ("stop", "length"), r
    _check_usage(r, MAX_TOKENS)


@pytest.mark.parametrize("call", ["generateObject", "outputObject"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_structured_output(results, provider, call):
    """A zod object (generateObject, or generateText with `Output.object`): a JSON-schema response_format
    (OpenAI-compatible), the forced `json` tool (Anthropic), Ollama's `format`; each constrained by shoal,
    and checked by the SDK against the zod schema."""
    r = _result(results, provider, call)
    person = Person.model_validate(r["object"])
    assert person.name.strip(), r
    _check_usage(r, 64)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_tools(results, provider):
    """One step with a zod tool: forced with `toolChoice: 'required'` where the API can force a call (not
    Ollama's), then the SDK validates the input and runs the tool."""
    r = _result(results, provider, "tools")
    assert r["steps"] == 1, r
    if r["forced"] or r["toolCalls"]:
        assert len(r["toolCalls"]) == 1, f"no tool call: {r}"
        call = r["toolCalls"][0]
        assert call["toolName"] == "GetWeather" and call["toolCallId"], r
        city = check_weather_args(call["input"]).city
        assert r["executed"] == [city], r
        assert r["toolResults"] == [{"toolName": "GetWeather", "output": f"It is sunny in {city}."}], r
        assert r["finishReason"] == "tool-calls", r
    else:
        assert r["text"].strip() and not r["executed"], r
