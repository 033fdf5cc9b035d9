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


def test_nodes_without_a_key_stay_apart_and_an_invite_joins_them():
    """Each node started without a cluster key makes its own: two such nodes never form a cluster, even
    when told each other's address. `shoal invite` on one prints a token; a node started with
    `--join TOKEN` joins that node's cluster."""
    import subprocess
    import time

    from conftest import _binary

    a = ShoalNode("--no-auto-instance", key=None)
    b = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr, key=None)
    c = None
    try:
        def members(node):
            return [n["id"] for n in json.loads(urllib.request.urlopen(f"{node.url}/state").read())["cluster"]["nodes"]]

        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert members(a) == [a.id] and members(b) == [b.id], "keyless nodes must not join"
            time.sleep(0.2)
        host_port = a.cluster_addr.split("/")[2] + ":" + a.cluster_addr.split("/")[4]
        out = subprocess.run([str(_binary()), "invite", "--state-dir", a.state_dir, "--addr", host_port],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        token = out.stdout.strip()
        assert token.startswith("shoal1:") and host_port in token, token
        c = ShoalNode("--no-auto-instance", "--join", token, key=None)
        wait_until("c to join a", lambda: sorted(members(a)) == sorted([a.id, c.id]))
        assert b.id not in members(c)
        bad = subprocess.run([str(_binary()), "serve", "--join", "nonsense", "--state-dir", c.state_dir],
                             capture_output=True, text=True, timeout=30)
        assert bad.returncode != 0 and "not a token" in bad.stderr, bad.stderr
    finally:
        for n in (c, b, a):
            if n:
                n.kill()
