"""Embeddings, log-probabilities and several choices with the official `openai` SDK against the real
`shoal serve`, on one node and on a 2-node pipeline (whose last stage pools, and samples, on the other
node).
"""

import math

import openai
import pytest

from conftest import MODEL_ID
from test_cluster import wait_until
# The 2-node pipeline of the tools suite (its own instance in this module), and its readiness check.
from test_openai_tools import _served, pipeline  # noqa: F401

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
