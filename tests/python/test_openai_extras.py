"""Embeddings, log-probabilities (top alternatives) and several choices (`n`) with the official `openai`
SDK against the real `shoal serve`, on one node and on a 2-node pipeline (whose last stage pools, and
samples, on the other node; a pipeline's choices fork their prompt's KV on both nodes).
"""

import math

import openai
import pytest

from conftest import MODEL_ID
from test_cluster import wait_until
# The 2-node pipeline of the tools suite (its own instance in this module), and its readiness check.
from test_openai_tools import _served

TEXTS = ["The capital of France is Paris.", "Hello", "Rust is a systems programming language."]


def _cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def _embed(client, **kwargs):
    return client.embeddings.create(model=MODEL_ID, input=TEXTS, **kwargs)


def test_embeddings_float_and_the_sdks_default_base64_agree(client):
    floats = _embed(client, encoding_format="float")
    assert floats.object == "list" and floats.model == MODEL_ID
    assert [d.index for d in floats.data] == [0, 1, 2]
    for d in floats.data:
        assert d.object == "embedding" and len(d.embedding) == 576
        assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1) < 1e-4
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(TEXTS)
    # Without encoding_format the SDK asks for base64 and decodes it.
    decoded = _embed(client)
    for a, b in zip(floats.data, decoded.data):
        assert a.embedding == pytest.approx(b.embedding, abs=1e-7)
    # Related texts are closer than unrelated ones.
    cap = client.embeddings.create(model=MODEL_ID, input="Paris is the capital of France.").data[0]
    assert _cosine(cap.embedding, floats.data[0].embedding) > _cosine(cap.embedding, floats.data[2].embedding)


def test_embedding_errors_name_their_parameter(client):
    for kwargs, param in [({"dimensions": 64}, "dimensions"), ({"input": ""}, "input"), ({"input": []}, "input")]:
        with pytest.raises(openai.BadRequestError) as err:
            client.embeddings.create(**{"model": MODEL_ID, "input": "x", **kwargs})
        assert err.value.body["param"] == param, err.value.body


@pytest.fixture(scope="module")
def remotes(pipeline):
    """Clients of both nodes of the 2-node pipeline (stages 0-15 and 15-30), once they serve the model."""
    clients = []
    for node in pipeline:
        c = openai.OpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0, timeout=180)
        wait_until(f"{node.url} to serve the model", lambda c=c: _served(c))
        clients.append(c)
    return clients


def test_a_two_node_pipeline_embeds_what_one_node_embeds(remotes, client):
    alone = _embed(client, encoding_format="float")
    for remote in remotes:
        got = _embed(remote, encoding_format="float")
        assert got.usage.prompt_tokens == alone.usage.prompt_tokens
        for a, b in zip(alone.data, got.data):
            assert _cosine(a.embedding, b.embedding) > 0.99999


QUESTION = [{"role": "user", "content": "Name three colors."}]


def _chat(client, **kwargs):
    params = {"model": MODEL_ID, "messages": QUESTION, "temperature": 0, "max_tokens": 6}
    params.update(kwargs)
    return client.chat.completions.create(**params)


def test_chat_top_logprobs_whole_and_streamed(client):
    resp = _chat(client, logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == entry.logprob  # greedy takes the best
        assert all(a.logprob >= b.logprob for a, b in zip(entry.top_logprobs, entry.top_logprobs[1:]))
        assert all(bytes(t.bytes).decode("utf-8", "replace") == t.token for t in entry.top_logprobs)
    streamed = []
    for chunk in _chat(client, logprobs=True, top_logprobs=3, stream=True):
        for choice in chunk.choices:
            if choice.logprobs and choice.logprobs.content:
                streamed.extend(choice.logprobs.content)
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]


def test_completion_logprobs_dicts(client):
    resp = client.completions.create(
        model=MODEL_ID, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=3
    )
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    for sampled, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert 3 <= len(top) <= 4 and max(top.values()) == pytest.approx(sampled)
    assert "".join(lp.tokens) == resp.choices[0].text


def test_n_choices_whole_and_streamed(client):
    one = _chat(client)
    three = _chat(client, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert all(c.message.content == one.choices[0].message.content for c in three.choices)
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    texts, finishes, usage = {}, {}, None
    for chunk in _chat(client, n=3, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts == {i: one.choices[0].message.content for i in range(3)}
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert usage.completion_tokens == three.usage.completion_tokens
    # Sampled with a seed: distinct choices, the same again.
    seeded = dict(temperature=1.0, seed=11, n=3, max_tokens=12)
    a = [c.message.content for c in _chat(client, **seeded).choices]
    b = [c.message.content for c in _chat(client, **seeded).choices]
    assert a == b and len(set(a)) == 3
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, n=17)
    assert err.value.body["param"] == "n"


def test_a_two_node_pipeline_reports_what_one_node_reports(remotes, client):
    alone = _chat(client, logprobs=True, top_logprobs=4, n=2)
    seeded = dict(temperature=1.0, seed=3, n=3, max_tokens=10)
    alone_seeded = [c.message.content for c in _chat(client, **seeded).choices]
    for remote in remotes:
        got = _chat(remote, logprobs=True, top_logprobs=4, n=2)
        for a, b in zip(alone.choices, got.choices):
            assert a.message.content == b.message.content
            for x, y in zip(a.logprobs.content, b.logprobs.content):
                assert [t.token for t in x.top_logprobs] == [t.token for t in y.top_logprobs]
                assert y.logprob == pytest.approx(x.logprob, abs=1e-3)
        assert [c.message.content for c in _chat(remote, **seeded).choices] == alone_seeded
