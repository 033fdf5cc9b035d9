"""`GET /openapi.json` of the real server: a valid OpenAPI 3.1 document (openapi-spec-validator), whose
response schemas the server's real answers satisfy — an OpenAI chat completion and its streamed chunks,
the listings (models, tags, ps, version, health), an Anthropic message and its stream's events, Ollama's chat lines — and which a wrong answer does not."""

import copy
import json
import urllib.request

import jsonschema
import pytest
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from conftest import MODEL_ID

ROOT = "urn:shoal-openapi"


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        return json.load(r)


def post(url: str, body: dict):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=120)


@pytest.fixture(scope="module")
def spec(server_url):
    return get_json(f"{server_url}/openapi.json")


def pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def response_validator(spec: dict, path: str, method: str, status: str, content_type: str):
    """A JSON-schema validator of the document's schema for that answer, its `$ref`s resolved in the
    document."""
    op = spec["paths"][path][method]
    assert content_type in op["responses"][status]["content"], f"{method} {path} {status} has no {content_type}"
    registry = Registry().with_resource(ROOT, Resource(contents=spec, specification=DRAFT202012))
    ref = f"{ROOT}#/" + pointer("paths", path, method, "responses", status, "content", content_type, "schema")
    return jsonschema.Draft202012Validator({"$ref": ref}, registry=registry)


def test_the_document_is_valid_openapi_3_1_with_every_api(spec):
    validate(spec)  # raises on an invalid document
    assert spec["openapi"].startswith("3.1")
    paths = spec["paths"]
    for path in ("/v1/chat/completions", "/v1/messages", "/api/chat", "/api/tags", "/state", "/openapi.json"):
        assert path in paths, path
    # Tool parameters are free-form JSON schemas: any JSON value, no type imposed.
    parameters = spec["components"]["schemas"]["FunctionIn"]["properties"]["parameters"]
    assert "type" not in parameters and "$ref" not in parameters, parameters


def test_a_real_chat_completion_satisfies_its_schema_and_a_wrong_one_does_not(server_url, spec):
    validator = response_validator(spec, "/v1/chat/completions", "post", "200", "application/json")
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    with post(f"{server_url}/v1/chat/completions", body) as r:
        assert r.status == 200
        answer = json.load(r)
    assert answer["object"] == "chat.completion"
    validator.validate(answer)
    assert answer["choices"][0]["logprobs"]["content"], "logprobs were asked for and validated"

    wrong = copy.deepcopy(answer)
    del wrong["choices"][0]["message"]
    assert not validator.is_valid(wrong), "a choice without its message passes"
    wrong = copy.deepcopy(answer)
    wrong["usage"]["prompt_tokens"] = "many"
    assert not validator.is_valid(wrong), "a string token count passes"
    wrong = copy.deepcopy(answer)
    wrong["choices"][0]["finish_reason"] = "bored"
    assert not validator.is_valid(wrong), "an unknown finish_reason passes"


def test_real_stream_chunks_satisfy_the_chunk_schema(server_url, spec):
    validator = response_validator(spec, "/v1/chat/completions", "post", "200", "text/event-stream")
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Count to three."}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = []
    with post(f"{server_url}/v1/chat/completions", body) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    assert len(chunks) >= 2
    for chunk in chunks:
        validator.validate(chunk)
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    # The error that ends a failed stream is stated too; a chunk with an unknown finish reason is not.
    validator.validate({"error": {"message": "m", "type": "server_error", "param": None, "code": None}})
    last = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    wrong = copy.deepcopy(last)
    wrong["choices"][0]["finish_reason"] = "bored"
    assert not validator.is_valid(wrong)


def test_real_anthropic_stream_events_satisfy_their_schema(server_url, spec):
    validator = response_validator(spec, "/v1/messages", "post", "200", "text/event-stream")
    body = {"model": MODEL_ID, "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "Say hello."}]}
    events = []
    with post(f"{server_url}/v1/messages", body) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds, kinds
    for event in events:
        validator.validate(event)
    wrong = copy.deepcopy(next(e for e in events if e["type"] == "message_delta"))
    wrong["delta"]["stop_reason"] = "tired"
    assert not validator.is_valid(wrong), "an unknown stop_reason passes"


@pytest.mark.parametrize("path", ["/v1/models", "/api/tags", "/api/ps", "/api/version", "/health"])
def test_real_listings_satisfy_their_schemas(server_url, spec, path):
    validator = response_validator(spec, path, "get", "200", "application/json")
    answer = get_json(f"{server_url}{path}")
    validator.validate(answer)
    if path in ("/v1/models", "/api/tags", "/api/ps"):
        listed = answer["data"] if path == "/v1/models" else answer["models"]
        assert any(m.get("id", m.get("model")) == MODEL_ID for m in listed), answer
    wrong = dict(answer)
    wrong.pop(next(iter(answer)))
    assert not validator.is_valid(wrong), f"{path} without its first field passes"


def test_a_real_anthropic_message_satisfies_its_schema(server_url, spec):
    validator = response_validator(spec, "/v1/messages", "post", "200", "application/json")
    body = {"model": MODEL_ID, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]}
    with post(f"{server_url}/v1/messages", body) as r:
        message = json.load(r)
    assert message["type"] == "message" and message["stop_reason"] in ("end_turn", "max_tokens")
    validator.validate(message)
    wrong = dict(message, stop_reason="tired")
    assert not validator.is_valid(wrong), "an unknown stop_reason passes"


@pytest.mark.parametrize("stream", [False, True])
def test_real_ollama_chat_lines_satisfy_their_schema(server_url, spec, stream):
    content_type = "application/x-ndjson" if stream else "application/json"
    validator = response_validator(spec, "/api/chat", "post", "200", content_type)
    body = {"model": MODEL_ID, "stream": stream, "options": {"num_predict": 6, "temperature": 0},
            "messages": [{"role": "user", "content": "Say hello."}]}
    with post(f"{server_url}/api/chat", body) as r:
        lines = [json.loads(line) for line in r.read().decode().splitlines() if line.strip()]
    assert len(lines) >= (2 if stream else 1)
    for line in lines:
        validator.validate(line)
    assert lines[-1]["done"] and lines[-1]["eval_count"] > 0
    if stream:
        assert "done_reason" not in lines[0], "only the last line ends the answer"
        validator.validate({"error": "the model went away"})  # the line that ends a failed stream
    wrong = dict(lines[-1])
    del wrong["done"]
    assert not validator.is_valid(wrong), "an answer without `done` passes"
