"""A draft model for speculative decoding through the real binary: `shoal serve --draft-model` (here the
served SmolLM2 itself, by id, the one model of this suite with a same-vocabulary partner) answers a
request asking `"speculative": {"method": "draft"}` with the greedy text of the same request without
speculation, its drafted tokens accepted (/metrics); a node without a draft model refuses such a
request with a 400 in the API's own shape and keeps serving; `--speculative draft` without
`--draft-model` stops the start with the reason."""

import json
import re
import subprocess
import urllib.error
import urllib.request

import pytest

from conftest import MODEL_ID, ShoalNode, _binary
from test_cluster import wait_until

PROMPT = "Count from one to ten in words, separated by commas."


def post(node: ShoalNode, path: str, body: dict):
    req = urllib.request.Request(f"{node.url}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def metric(node: ShoalNode, name: str, model: str = MODEL_ID) -> float:
    with urllib.request.urlopen(f"{node.url}/metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(r"^" + name + r'\{model="' + re.escape(model) + r'"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def chat(node: ShoalNode, speculative):
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40,
            "temperature": 0}
    if speculative is not None:
        body["speculative"] = speculative
    return post(node, "/v1/chat/completions", body)


def served(node: ShoalNode) -> ShoalNode:
    wait_until("the model to be served", lambda: post(node, "/v1/completions", {
        "model": MODEL_ID, "prompt": "a", "max_tokens": 1})[0] == 200, 120)
    return node


@pytest.fixture(scope="module")
def drafting():
    n = ShoalNode("--draft-model", MODEL_ID, key="python-tests-draft-model")
    try:
        yield served(n)
    finally:
        n.kill()


def test_a_draft_models_drafts_give_the_same_greedy_answer_and_are_accepted(drafting):
    status, plain = chat(drafting, {"method": "off"})
    assert status == 200, plain
    before = metric(drafting, "shoal_speculative_accepted_tokens_total")
    status, drafted = chat(drafting, {"method": "draft", "max_draft": 6})
    assert status == 200, drafted
    assert drafted["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    for k in ("prompt_tokens", "completion_tokens"):
        assert drafted["usage"][k] == plain["usage"][k], (drafted["usage"], plain["usage"])
    # The model drafting for itself: most of the answer's tokens came in as accepted drafts.
    gained = metric(drafting, "shoal_speculative_accepted_tokens_total") - before
    assert gained >= plain["usage"]["completion_tokens"] // 2, gained


def test_a_node_without_a_draft_model_refuses_draft_requests_and_keeps_serving():
    n = ShoalNode(key="python-tests-no-draft-model")
    try:
        served(n)
        status, err = chat(n, {"method": "draft"})
        assert status == 400, err
        assert err["error"]["param"] == "speculative" and "--draft-model" in err["error"]["message"], err
        status, ok = chat(n, None)
        assert status == 200 and ok["choices"][0]["message"]["content"], ok
    finally:
        n.kill()


def test_speculative_draft_without_a_draft_model_stops_the_start():
    out = subprocess.run([str(_binary()), "serve", "--speculative", "draft", "--api-port", "0",
                          "--cluster-listen", "127.0.0.1:0", "--no-mdns"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "--speculative draft needs --draft-model" in out.stderr, out.stderr[-2000:]
