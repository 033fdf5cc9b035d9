"""API keys with the real `openai` SDK against real `shoal serve` processes: a wrong or missing key is refused
with a 401 the SDK understands, the right one is served, `/health` stays open, and a request sent to a node
that does not drive the model is forwarded with its key and answered. Keys also come from SHOAL_API_KEY."""

import json
import os
import urllib.error
import urllib.request

import openai
import pytest

from conftest import MODEL_ID, ShoalNode
from test_cluster import wait_until

KEY = "s3cret-key"


def ask(node, key):
    c = openai.OpenAI(base_url=f"{node.url}/v1", api_key=key, max_retries=0, timeout=120)
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Say hi."}],
                                  max_tokens=4, temperature=0)
    return r.choices[0].message.content


def status_of(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def keyed_pair():
    a = ShoalNode("--api-key", KEY, key="api-key-tests")
    b = ShoalNode("--no-auto-instance", "--api-key", KEY, "--peer", a.cluster_addr, key="api-key-tests")
    try:
        def both_members(node):
            status, body = status_of(f"{node.url}/state", {"Authorization": f"Bearer {KEY}"})
            return status == 200 and len(body["cluster"]["nodes"]) == 2

        for n in (a, b):
            wait_until("both nodes to be members", lambda n=n: both_members(n))
        yield a, b
    finally:
        b.kill()
        a.kill()


def test_a_wrong_or_missing_key_is_a_401_and_the_right_one_is_served(keyed_pair):
    a, _ = keyed_pair
    with pytest.raises(openai.AuthenticationError) as err:
        ask(a, "wrong")
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key", err.value
    status, body = status_of(f"{a.url}/v1/models")
    assert status == 401 and body["error"]["code"] == "invalid_api_key", body
    assert ask(a, KEY)
    assert status_of(f"{a.url}/health") == (200, {"status": "ok"})
    status, _ = status_of(f"{a.url}/state")
    assert status == 401
    status, _ = status_of(f"{a.url}/state", {"Authorization": f"Bearer {KEY}"})
    assert status == 200


def test_a_forwarded_request_keeps_its_key(keyed_pair):
    a, b = keyed_pair
    # b does not drive the model: it forwards to a, with the client's key.
    assert wait_until("b to answer through a", lambda: ask(b, KEY))
    with pytest.raises(openai.AuthenticationError):
        ask(b, "wrong")


def test_keys_from_the_environment():
    env = {**os.environ, "SHOAL_API_KEY": "env-one,env-two"}
    n = ShoalNode("--no-auto-instance", key="api-key-env", env=env)
    try:
        assert status_of(f"{n.url}/v1/models")[0] == 401
        assert status_of(f"{n.url}/v1/models", {"x-api-key": "env-two"})[0] == 200
        assert status_of(f"{n.url}/v1/models", {"Authorization": "Bearer env-one"})[0] == 200
    finally:
        n.kill()
