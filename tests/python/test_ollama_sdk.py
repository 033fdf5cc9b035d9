"""The Ollama API with the real `ollama` Python client against real `shoal serve` processes: chat and generate,
streaming and not (greedy answers equal to the OpenAI route's), options reaching the sampler, `format` (JSON
schemas) and `tools` (calls and the next turn), embed and embeddings, tags / show / ps / version, errors raised as `ollama.ResponseError` with the right status, an API-key-protected server, a pull
from a stand-in hub (scripts/fakehub) with progress lines followed by a chat with the pulled model and its
delete, and a 2-node pipeline answered through either node."""

import datetime
import hashlib
import json
import math
import os
import urllib.request

import ollama
import pytest

from conftest import MODEL_ID, ShoalNode
from test_cluster import wait_until
from test_store import FakeHub, smollm2_file

QUESTION = "What is the capital of France?"
MESSAGES = [{"role": "user", "content": QUESTION}]
# The catalog's sha256 of the SmolLM2 file.
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@pytest.fixture(scope="session")
def oc(server_url) -> ollama.Client:
    return ollama.Client(host=server_url, timeout=120)


def assert_metrics(r, eval_count=None):
    assert r.done is True
    assert r.done_reason in ("stop", "length")
    assert r.prompt_eval_count > 5
    if eval_count is not None:
        assert r.eval_count == eval_count
    for d in (r.total_duration, r.load_duration, r.prompt_eval_duration, r.eval_duration):
        assert d is not None and d > 0, r
    assert r.total_duration >= r.prompt_eval_duration + r.eval_duration
    created = datetime.datetime.fromisoformat(r.created_at.replace("Z", "+00:00")[:26] + "+00:00")
    assert abs((datetime.datetime.now(datetime.timezone.utc) - created).total_seconds()) < 600


def test_chat_greedy_equals_the_openai_chat(oc, client):
    r = oc.chat(model=MODEL_ID, messages=MESSAGES, options={"temperature": 0, "num_predict": 16})
    o = client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, temperature=0, max_tokens=16)
    assert r.message.role == "assistant"
    assert r.message.content == o.choices[0].message.content
    assert r.done_reason == o.choices[0].finish_reason
    assert r.prompt_eval_count == o.usage.prompt_tokens
    assert_metrics(r, o.usage.completion_tokens)


def test_chat_streaming_matches_not_streaming(oc):
    options = {"temperature": 0, "num_predict": 12}
    whole = oc.chat(model=MODEL_ID, messages=MESSAGES, options=options)
    parts = list(oc.chat(model=MODEL_ID, messages=MESSAGES, options=options, stream=True))
    assert len(parts) >= 3
    assert all(not p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done_reason == "length"
    assert_metrics(parts[-1], 12)


def test_generate_streaming_and_not_and_raw(oc, client):
    options = {"temperature": 0, "num_predict": 10}
    g = oc.generate(model=MODEL_ID, prompt=QUESTION, options=options)
    c = oc.chat(model=MODEL_ID, messages=MESSAGES, options=options)
    assert g.response == c.message.content
    assert_metrics(g, g.eval_count)
    parts = list(oc.generate(model=MODEL_ID, prompt=QUESTION, options=options, stream=True))
    assert "".join(p.response for p in parts) == g.response and parts[-1].done
    raw = oc.generate(model=MODEL_ID, prompt="The capital of France is", raw=True, options=options)
    o = client.completions.create(model=MODEL_ID, prompt="The capital of France is", temperature=0, max_tokens=10)
    assert raw.response == o.choices[0].text


def test_options_reach_the_sampler(oc):
    r = oc.chat(model=MODEL_ID, messages=MESSAGES, options={"num_predict": 4, "temperature": 0})
    assert r.done_reason == "length" and r.eval_count == 4
    seeded = {"temperature": 0.9, "top_k": 40, "top_p": 0.9, "seed": 11, "repeat_penalty": 1.1, "num_predict": 12}
    a = oc.chat(model=MODEL_ID, messages=MESSAGES, options=seeded, keep_alive="10m")
    b = oc.chat(model=MODEL_ID, messages=MESSAGES, options=ollama.Options(**seeded), keep_alive=-1)
    assert a.message.content == b.message.content
    free = oc.chat(model=MODEL_ID, messages=MESSAGES, options={"temperature": 0, "num_predict": 20}).message.content
    word = free.split()[2]
    stopped = oc.chat(model=MODEL_ID, messages=MESSAGES, options={"temperature": 0, "num_predict": 20, "stop": [word]})
    assert free.startswith(stopped.message.content) and word not in stopped.message.content
    assert stopped.done_reason == "stop"


def test_empty_prompt_loads_the_model(oc):
    r = oc.generate(model=MODEL_ID)
    assert r.done and r.done_reason == "load" and r.response == ""


def test_tags_show_ps_version(oc, server_url):
    listed = {m.model: m for m in oc.list().models}
    m = listed[MODEL_ID]
    assert m.digest == SMOLLM2_SHA256
    assert m.size == smollm2_file().stat().st_size
    assert m.details.format == "gguf" and m.details.family == "llama"
    assert m.details.quantization_level == "Q4_1" and m.details.parameter_size.endswith("M")
    assert isinstance(m.modified_at, datetime.datetime)
    s = oc.show(MODEL_ID)
    assert "<|im_start|>" in s.template
    assert s.modelinfo["general.architecture"] == "llama"
    assert s.modelinfo["llama.context_length"] == 8192
    assert s.details.family == "llama" and {"completion", "tools"} <= set(s.capabilities)
    running = {p.model: p for p in oc.ps().models}
    assert running[MODEL_ID].context_length == 8192 and running[MODEL_ID].size_vram == 0
    with urllib.request.urlopen(f"{server_url}/api/version", timeout=30) as r:
        assert json.load(r)["version"]


def test_errors_raise_response_error_with_the_status(oc):
    with pytest.raises(ollama.ResponseError) as e:
        oc.chat(model="no-such-model", messages=MESSAGES)
    assert e.value.status_code == 404 and e.value.error == 'model "no-such-model" not found, try pulling it first'
    with pytest.raises(ollama.ResponseError) as e:
        list(oc.chat(model="no-such-model", messages=MESSAGES, stream=True))
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        oc.chat(model=MODEL_ID, messages=[{"role": "user", "content": "hi", "images": ["aGVsbG8="]}])
    assert e.value.status_code == 400 and "images" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        oc.generate(model=MODEL_ID, prompt="hi", options={"top_p": 5})
    assert e.value.status_code == 400 and "options.top_p" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        oc.show("no-such-model")
    assert e.value.status_code == 404
    # Still serving.
    assert oc.generate(model=MODEL_ID, prompt="Hi", options={"num_predict": 2}).done


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
      city: The city
    """
    return f"18 degrees and sunny in {city}"


# The generic tool-call form, so the (auto) call is certain: Ollama has no tool_choice.
CALL_SCHEMA = {
    "type": "object", "required": ["tool_calls"], "additionalProperties": False,
    "properties": {"tool_calls": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
        "type": "object", "required": ["name", "arguments"], "additionalProperties": False,
        "properties": {"name": {"const": "get_weather"}, "arguments": {
            "type": "object", "required": ["city"], "additionalProperties": False,
            "properties": {"city": {"type": "string", "maxLength": 12}}}}}}},
}
CAPITAL_SCHEMA = {"type": "object", "required": ["capital"], "additionalProperties": False,
                  "properties": {"capital": {"type": "string", "maxLength": 16}}}


def test_format_constrains_the_answer(oc):
    r = oc.chat(model=MODEL_ID, messages=MESSAGES, format=CAPITAL_SCHEMA, options={"temperature": 0, "num_predict": 40})
    assert r.done_reason == "stop"
    assert set(json.loads(r.message.content)) == {"capital"}
    parts = list(oc.generate(model=MODEL_ID, prompt=QUESTION, format=CAPITAL_SCHEMA, stream=True,
                             options={"temperature": 0, "num_predict": 40}))
    assert isinstance(json.loads("".join(p.response for p in parts))["capital"], str)


def test_tools_calls_and_the_next_turn(oc):
    r = oc.chat(model=MODEL_ID, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                tools=[get_weather], format=CALL_SCHEMA, options={"temperature": 0, "num_predict": 60})
    assert r.message.tool_calls, r.message
    call = r.message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(call.function.arguments["city"], str)
    assert not r.message.content
    streamed = [p for p in oc.chat(model=MODEL_ID, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                   tools=[get_weather], format=CALL_SCHEMA, stream=True,
                                   options={"temperature": 0, "num_predict": 60}) if p.message.tool_calls]
    assert len(streamed) == 1 and streamed[0].message.tool_calls[0].function == call.function
    result = get_weather(**call.function.arguments)
    follow = oc.chat(model=MODEL_ID, tools=[get_weather], options={"temperature": 0, "num_predict": 30}, messages=[
        {"role": "user", "content": "What is the weather in Paris?"}, r.message,
        {"role": "tool", "content": result, "tool_name": "get_weather"}])
    assert follow.done and follow.prompt_eval_count > r.prompt_eval_count
    assert follow.message.content or follow.message.tool_calls


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embed_and_the_older_embeddings(oc):
    texts = ["The sky is blue.", "Paris is the capital of France."]
    r = oc.embed(model=MODEL_ID, input=texts)
    assert len(r.embeddings) == 2 and all(len(v) == 576 for v in r.embeddings)
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4 for v in r.embeddings)
    assert cosine(*r.embeddings) < 0.999
    assert r.prompt_eval_count > 5 and r.total_duration > 0
    assert oc.embed(model=MODEL_ID, input=texts[0]).embeddings[0] == r.embeddings[0]
    assert list(oc.embeddings(model=MODEL_ID, prompt=texts[0]).embedding) == list(r.embeddings[0])
    short = oc.embed(model=MODEL_ID, input=texts[0], dimensions=32).embeddings[0]
    assert len(short) == 32 and abs(math.sqrt(sum(x * x for x in short)) - 1) < 1e-4
    with pytest.raises(ollama.ResponseError) as e:
        oc.embed(model=MODEL_ID, input="hello " * 9000, truncate=False)
    assert e.value.status_code == 400 and "input" in e.value.error


def test_an_api_key_protected_server():
    node = ShoalNode("--api-key", "K", key="ollama-api-key")
    try:
        ok = ollama.Client(host=node.url, headers={"Authorization": "Bearer K"}, timeout=120)
        assert ok.chat(model=MODEL_ID, messages=MESSAGES, options={"num_predict": 3}).done
        assert MODEL_ID in [m.model for m in ok.list().models]
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            with pytest.raises(ollama.ResponseError) as e:
                ollama.Client(host=node.url, headers=headers, timeout=30).list()
            assert e.value.status_code == 401 and "API key" in e.value.error
    finally:
        node.kill()


@pytest.fixture
def store_node(tmp_path):
    """A node whose models dir holds SmolLM2 (a link) and whose hub is a fakehub serving it as a Q4_K_M repo,
    throttled so a pull shows progress."""
    hub = FakeHub(tmp_path / "hub", "--rate", "40000000")
    repo = hub.root / "org" / "Smol-GGUF"
    repo.mkdir(parents=True)
    (repo / "SmolLM2-135M-Instruct-Q4_K_M.gguf").symlink_to(smollm2_file())
    models = tmp_path / "models"
    (models / MODEL_ID).mkdir(parents=True)
    (models / MODEL_ID / smollm2_file().name).symlink_to(smollm2_file())
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=hub.url)
    node = ShoalNode(key="ollama-pull", models_dir=models, env=env)
    try:
        yield node, models
    finally:
        node.kill()
        hub.stop()


def test_pull_with_progress_chat_and_delete(store_node):
    node, models = store_node
    oc = ollama.Client(host=node.url, timeout=300)
    name = "org/Smol-GGUF:Q4_K_M"
    size = smollm2_file().stat().st_size
    sha = hashlib.sha256(smollm2_file().read_bytes()).hexdigest()
    lines = list(oc.pull(name, stream=True))
    statuses = [p.status for p in lines]
    assert statuses[0] == "pulling manifest" and statuses[-2:] == ["verifying sha256 digest", "success"], statuses
    downloading = [p for p in lines if p.status.startswith("downloading")]
    assert len(downloading) >= 3, statuses
    assert all(p.digest == f"sha256:{sha}" and p.total == size for p in downloading)
    completed = [p.completed for p in downloading]
    assert completed == sorted(completed) and completed[-1] == size and completed[0] < size
    assert oc.pull(name).status == "success"  # present now: answered at once

    listed = {m.model: m for m in oc.list().models}
    assert listed[name].digest == sha and listed[name].size == size
    r = oc.chat(model=name, messages=MESSAGES, options={"temperature": 0, "num_predict": 8})
    assert r.model == name and r.message.content

    assert oc.delete(name).status == "success"
    assert not (models / "org--Smol-GGUF--Q4_K_M").exists()
    with pytest.raises(ollama.ResponseError) as e:
        oc.delete(name)
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        oc.pull("org/No-Such-GGUF:Q4_K_M")
    assert e.value.status_code == 404 and "not found" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        list(oc.pull("no-such-model", stream=True))
    assert e.value.status_code == 404


def test_a_two_node_pipeline_answers_through_either_node(oc, pipeline):
    a, b = pipeline
    options = {"temperature": 0, "num_predict": 12}
    ca, cb = (ollama.Client(host=n.url, timeout=120) for n in (a, b))

    def answer():
        try:
            return ca.chat(model=MODEL_ID, messages=MESSAGES, options=options)
        except ollama.ResponseError as e:
            assert e.status_code == 404, e  # the engine may still be registering
            return None

    whole = wait_until("the pipeline to answer", answer)
    assert whole.message.content and whole.eval_count == 12
    # b drives nothing: it forwards to a, streaming included.
    parts = list(cb.chat(model=MODEL_ID, messages=MESSAGES, options=options, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done and parts[-1].eval_count == whole.eval_count
    g = cb.generate(model=MODEL_ID, prompt=QUESTION, options=options)
    assert g.response == whole.message.content
    # A schema constrains decoding on the pipeline too (the mask travels to the sampling stage).
    j = ca.chat(model=MODEL_ID, messages=MESSAGES, format=CAPITAL_SCHEMA, options={"temperature": 0, "num_predict": 40})
    assert set(json.loads(j.message.content)) == {"capital"}
    # b lists the model a drives as running, with what b knows of it.
    assert MODEL_ID in [m.model for m in cb.ps().models]
    assert MODEL_ID in [m.model for m in cb.list().models]
    # Embeddings through the pipeline (the last stage pools) match one node's.
    texts = ["The sky is blue.", "Paris is the capital of France."]
    here = cb.embed(model=MODEL_ID, input=texts).embeddings
    single = oc.embed(model=MODEL_ID, input=texts).embeddings
    assert all(cosine(x, y) > 0.999 for x, y in zip(here, single))
