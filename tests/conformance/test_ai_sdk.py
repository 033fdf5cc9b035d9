"""Vercel's AI SDK (the `ai` npm package) against a real shoal, through its OpenAI-compatible, Anthropic and
Ollama providers: `generateText`, `streamText`, `generateObject` and `generateText`'s `Output.object` with
a zod schema, stop sequences, tool calls with a zod input schema (one step, generated and streamed; two
steps, the result sent back; a conversation holding a call and its result) and `embedMany`.
ai-sdk/calls.mjs makes the calls and prints what came back, one JSON line per call; the assertions are
here.

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
FORCING = ["openai_compatible", "anthropic"]  # the providers whose API can force a call (not Ollama's)
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


@pytest.mark.parametrize("provider", PROVIDERS)
def test_stop_sequences(results, provider):
    """generateText's call again with a stop sequence, a word of its answer (Ollama's provider drops
    stopSequences: passed in its options), generated and streamed: the same text, cut where the stop
    sequence began, left out."""
    r = _result(results, provider, "stopSequences")
    full = _result(results, provider, "generateText")["text"]
    stop = r["stop"]
    assert r["streamed"] == r["text"], r
    # The stop sequence is a word of `full` (calls.mjs picks it): greedy, the same answer is cut where
    # it began.
    assert stop in full, (full, r)
    assert stop not in r["text"] and r["finishReason"] == r["streamedFinishReason"] == "stop", r
    assert full.index(stop) == len(r["text"]) and full.startswith(r["text"]), (full, r)
    if provider == "anthropic":
        assert r["rawFinishReason"] == "stop_sequence", r


@pytest.mark.parametrize("provider", ["openai_compatible", "ollama"])
def test_embed_many(results, provider):
    """embedMany through the provider's embedding model (/v1/embeddings, /api/embed)."""
    r = _result(results, provider, "embedMany")
    a, b = r["embeddings"]
    assert len(a) == len(b) > 1 and a != b, r["usage"]
    assert r["usage"]["tokens"] > 0, r["usage"]


@pytest.mark.parametrize(("provider", "call"), [
    *((p, c) for p in PROVIDERS for c in ("generateObject", "outputObject")),
    ("anthropic", "generateObjectOutputFormat"),
])
def test_structured_output(results, provider, call):
    """A zod object (generateObject, or generateText with `Output.object`): a JSON-schema response_format
    (OpenAI-compatible), the forced `json` tool or `output_config.format` (Anthropic), Ollama's `format`;
    each constrained by shoal, and checked by the SDK against the zod schema."""
    r = _result(results, provider, call)
    person = Person.model_validate(r["object"])
    assert person.name.strip(), r
    _check_usage(r, 64)
    if call == "generateObjectOutputFormat":  # no `json` tool described in the prompt this time
        tool_mode = _result(results, provider, "generateObject")
        assert r["usage"]["inputTokens"] < tool_mode["usage"]["inputTokens"], (r, tool_mode)


def _check_call(r: dict, call: dict, ran: bool = True) -> str:
    """`call` is a valid GetWeather call (that the SDK ran, if `ran`); its city."""
    assert call["toolName"] == "GetWeather" and call["toolCallId"] and not call["invalid"], r
    city = check_weather_args(call["input"]).city
    if ran:
        assert city in r["executed"], r
        assert {"toolName": "GetWeather", "output": f"It is sunny in {city}."} in r["toolResults"], r
    return city


@pytest.mark.parametrize("call", ["tools", "streamTools"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_tools(results, provider, call):
    """One step with a zod tool, generated and streamed: forced by name where the API can force a call (not
    Ollama's), so exactly one call, whose input the SDK validates before running the tool."""
    r = _result(results, provider, call)
    assert r["steps"] == 1, r
    if r["forced"] or r["toolCalls"]:
        assert len(r["toolCalls"]) == 1, f"not one tool call: {r}"
        _check_call(r, r["toolCalls"][0])
        assert r["executed"] == [r["toolCalls"][0]["input"]["city"]], r
        assert r["finishReason"] == "tool-calls", r
        if call == "streamTools":  # the arguments came as deltas of a streamed call
            assert "tool-input-delta" in r["parts"], r
    else:
        assert r["text"].strip() and not r["executed"], r


@pytest.mark.parametrize("provider", FORCING)
def test_tools_required(results, provider):
    """`toolChoice: 'required'`: one call or more (parallel calls are allowed, and a small model may repeat
    the call until the token cap cuts the last one); every call but a cut last one is valid, and all ran
    unless the answer was cut (the SDK runs no tool of a step that ended with an invalid call)."""
    r = _result(results, provider, "toolsRequired")
    calls = r["toolCalls"]
    assert calls, f"no tool call: {r}"
    assert r["finishReason"] in ("tool-calls", "length"), r
    cut = r["finishReason"] == "length"
    whole = calls[:-1] if cut and calls[-1]["invalid"] else calls
    assert whole, f"no whole call: {r}"
    for call in whole:
        _check_call(r, call, ran=not cut)


@pytest.mark.parametrize("provider", FORCING)
def test_two_steps(results, provider):
    """A forced call, its result sent back (an assistant tool call and a tool result in the API's own
    shape), then an answer in a second step."""
    r = _result(results, provider, "twoSteps")
    first, second = r["steps"]  # exactly two
    assert first["finishReason"] == "tool-calls" and len(first["toolCalls"]) == 1, r
    assert r["executed"] == [check_weather_args(first["toolCalls"][0]["input"]).city], r
    assert not second["toolCalls"] and second["text"].strip(), r
    assert second["finishReason"] in ("stop", "length"), r
    assert 0 < second["usage"]["outputTokens"] <= 64, r


@pytest.mark.parametrize("provider", PROVIDERS)
def test_tool_history(results, provider):
    """A conversation holding a call and its result (written by hand; the way to send one to Ollama's API):
    answered with text, and its prompt is longer than the question alone by the call and the result."""
    r = _result(results, provider, "toolHistory")
    assert r["text"].strip() and not r["toolCalls"], r
    assert r["finishReason"] in ("stop", "length"), r
    assert r["usage"]["inputTokens"] >= r["plainInputTokens"] + 20, r
