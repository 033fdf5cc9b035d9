"""schemathesis against the real server: every operation of `GET /openapi.json`, fed cases generated from
the document itself — valid ones (positive) and ones that break it (negative) — and each answer checked:
no 5xx, the status, content type and body the document states for it, and the node still answering
`/health` at the end. A short bounded pass (about two minutes); `scripts/fuzz-api` runs the long one.

The node runs on a models directory of its own (hard links to the test model: `DELETE /api/delete` and
the downloads routes get fuzzed too), offline. Generation is kept short — `max_tokens` and the like are
capped, or set where a case leaves them out — so no route is left out for being slow.
"""

import collections
import json
import os
import shutil
import time
import urllib.error
import urllib.request

import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from conftest import MODEL_ID, ShoalNode, _models_dir

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# The short pass: this many cases per operation and generation mode, derandomised, within BUDGET_S (past
# it the test fails). With SHOAL_SCHEMATHESIS_SECONDS set (scripts/fuzz-api), rounds of fresh random
# cases over every operation until that many seconds are spent.
EXAMPLES = int(os.environ.get("SHOAL_SCHEMATHESIS_EXAMPLES", "40"))
BUDGET_S = float(os.environ.get("SHOAL_SCHEMATHESIS_BUDGET_S", "150"))
LONG_S = float(os.environ.get("SHOAL_SCHEMATHESIS_SECONDS", "0"))
# Where the node's stderr goes as well (scripts/fuzz-api keeps it).
LOG = os.environ.get("SHOAL_SCHEMATHESIS_LOG")
# The generation length fields, capped (and set where a case has none) so a case takes well under a
# second; `n` bounds the choices of one request.
CAPS = {"max_tokens": 3, "max_completion_tokens": 3, "max_output_tokens": 3, "num_predict": 3, "n": 2}
GENERATION = {
    "/v1/chat/completions": ("max_tokens",),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
    "/v1/messages": ("max_tokens",),
    "/api/chat": ("options", "num_predict"),
    "/api/generate": ("options", "num_predict"),
}
# The routes that read a served model: a valid case names the one this node serves (a random name only
# reaches the 404), so positive cases get to the engine; negative cases keep what they were given.
SERVED_MODEL = {
    *GENERATION, "/v1/embeddings", "/v1/messages/count_tokens", "/api/embed", "/api/embeddings", "/api/show",
}


def cap(value):
    """Lowers every length field in `value` to its cap (a huge one is valid too: the server generates up to
    the context, which takes minutes here)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in CAPS and type(item) is int and item > CAPS[key]:
                value[key] = CAPS[key]
            else:
                cap(item)
    elif isinstance(value, list):
        for item in value:
            cap(item)


def bound_generation(path: str, body, mode: GenerationMode) -> None:
    """Caps a generation request's length, setting it where the case leaves it out (the default is the
    whole context); a valid case names the served model."""
    cap(body)
    if mode == GenerationMode.POSITIVE and path in SERVED_MODEL and isinstance(body, dict):
        body["model"] = MODEL_ID
    field = GENERATION.get(path)
    if field is None or not isinstance(body, dict):
        return
    # Absent or null: the default, which for chat is the whole context.
    if len(field) == 2:
        if body.get(field[0]) is None:
            body[field[0]] = {}
        if isinstance(body[field[0]], dict) and body[field[0]].get(field[1]) is None:
            body[field[0]][field[1]] = CAPS[field[1]]
    elif body.get(field[0]) is None:
        body[field[0]] = CAPS[field[0]]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A node on its own models directory (hard links to the test model's files), offline."""
    models = tmp_path_factory.mktemp("schemathesis-models")
    source = _models_dir() / MODEL_ID
    (models / MODEL_ID).mkdir()
    for f in source.iterdir():
        try:
            os.link(f, models / MODEL_ID / f.name)
        except OSError:
            shutil.copy2(f, models / MODEL_ID / f.name)
    # The node's stderr also appended to LOG, through a shell the node replaces (`exec`).
    wrap = ["bash", "-c", 'exec "$@" 2> >(tee -a "$0" >&2)', LOG] if LOG else None
    n = ShoalNode("--offline", key="python-tests-schemathesis", threads=os.cpu_count() or 1, models_dir=models,
                  wrap=wrap)
    try:
        yield n
    finally:
        n.kill()


def events_as_items(document: dict) -> dict:
    """The document with each `text/event-stream` schema moved to where schemathesis reads an event's
    JSON `data`: this 3.1 document states, under `schema`, the JSON of each event's `data` (what
    test_openapi.py checks real streams against), while schemathesis reads an event stream's schema as
    the event itself (`{data, event, id}`: Open API 3.2's `itemSchema`). OpenAI's closing
    `data: [DONE]` is not JSON and is allowed as it is."""
    for item in document["paths"].values():
        for op in item.values():
            for response in op.get("responses", {}).values():
                media = response.get("content", {}).get("text/event-stream")
                if media and "schema" in media:
                    data = {"type": "string", "if": {"const": "[DONE]"},
                            "else": {"contentMediaType": "application/json", "contentSchema": media.pop("schema")}}
                    media["itemSchema"] = {"type": "object", "required": ["data"], "properties": {"data": data}}
    return document


def load_schema(url: str, **config):
    with urllib.request.urlopen(f"{url}/openapi.json", timeout=30) as r:
        document = events_as_items(json.load(r))
    return schemathesis.openapi.from_dict(document, config=schemathesis.Config.from_dict(
        {"base-url": url, "max-stream-events": 3, "request-timeout": 20,
         # Failing cases are reported as sent (`max_tokens` is no secret).
         "output": {"sanitization": {"enabled": False}}, **config}))


def test_every_operation_answers_generated_cases_as_documented_and_the_node_survives(node):
    schema = load_schema(node.url)
    operations = [op.ok() for op in schema.get_all_operations()]
    assert len(operations) >= 30, [op.label for op in operations]

    cases: "collections.Counter[str]" = collections.Counter()
    statuses: "collections.Counter[int]" = collections.Counter()
    failures: "list[str]" = []
    started = time.monotonic()
    rounds = 0

    def run_operation(op, mode) -> None:
        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck),
                  derandomize=not LONG_S)
        def run(case):
            bound_generation(op.path, case.body, mode)
            cases[f"{op.label} {mode.value}"] += 1
            try:
                response = case.call_and_validate(checks=CHECKS)
            except (Exception, BaseExceptionGroup) as e:  # failed checks or a request that got no answer
                failures.append(f"{op.label} ({mode.value}): {e}\n{case.as_curl_command()}"[:1500])
                return
            statuses[response.status_code] += 1

        try:
            run()
        except Unsatisfiable:
            pass  # no invalid case could be made of this operation's parameters

    while True:
        rounds += 1
        for op in operations:
            # An operation with no parameters and no body has nothing to break: valid cases only.
            breakable = any(len(p) for p in (op.path_parameters, op.query, op.headers, op.body))
            modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if breakable else (GenerationMode.POSITIVE,)
            for mode in modes:
                if not LONG_S and time.monotonic() - started > BUDGET_S:
                    pytest.fail(f"the pass ran past its {BUDGET_S} s budget at {op.label} ({mode.value})")
                run_operation(op, mode)
        if not LONG_S or time.monotonic() - started > LONG_S or len(failures) > 200:
            break

    total = sum(cases.values())
    tested = {label.rsplit(" ", 1)[0] for label in cases}
    print(f"\nschemathesis: {len(tested)} of {len(operations)} operations, {total} cases in {rounds} round(s), "
          f"{time.monotonic() - started:.0f} s; statuses {dict(sorted(statuses.items()))}")
    for label, n in sorted(cases.items()):
        print(f"  {n:6d}  {label}")
    assert not failures, f"{len(failures)} failing cases:\n\n" + "\n\n".join(failures[:20])
    assert tested == {op.label for op in operations}, "every operation got cases"
    with urllib.request.urlopen(f"{node.url}/health", timeout=10) as r:
        assert r.status == 200
    assert node.proc.poll() is None, "the node is still running"


def test_a_refusal_axum_writes_itself_is_answered_in_the_routes_api_shape(node):
    """What the pass found: a query or body a bare extractor refuses was a `text/plain` 4xx."""
    for method, path, body in (("DELETE", "/downloads/some-model?bogus=1", None), ("POST", "/doctor", b"{bad")):
        req = urllib.request.Request(f"{node.url}{path}", data=body, method=method,
                                     headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 400, (path, e.value.code)
        assert e.value.headers["content-type"] == "application/json", path
        error = json.load(e.value)["error"]
        assert error["type"] == "invalid_request_error" and error["message"], (path, error)
    # `null` is what the document allows for the doctor's optional options: the defaults.
    req = urllib.request.Request(f"{node.url}/doctor", data=b"null", method="POST",
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200 and "peers" in json.load(r)


def test_a_nodes_device_choice_is_documented_as_the_cluster_publishes_it(node):
    """What the pass found: the dashboard's events carry `"device": "cpu"`, documented as an object."""
    with urllib.request.urlopen(f"{node.url}/openapi.json", timeout=30) as r:
        document = json.load(r)
    registry = Registry().with_resource("urn:doc", Resource(contents=document, specification=DRAFT202012))
    device = jsonschema.Draft202012Validator({"$ref": "urn:doc#/components/schemas/NodeView/properties/device"},
                                             registry=registry)
    for ok in ("cpu", "auto", {"gpu": 0}, {"gpu": 3}):
        assert device.is_valid(ok), ok
    for wrong in ("gpu", {}, {"gpu": -1}, 3, None):
        assert not device.is_valid(wrong), wrong
