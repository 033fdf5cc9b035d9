"""Removal that holds, with real `shoal` processes: `shoal remove NODE` rotates the cluster key. The
remaining members agree on a new key (epoch + 1, the same key in every member's
`<state-dir>/cluster-keys.json`); the removed node, restarted with the old key it still holds and told a
member's address, stays alone, and so does a new identity made with the old key; a member that was stopped
during the removal comes back with its old key, is let in by its identity and leaves with the new key; and
a machine invited afterwards is handed the new key; and the cluster still serves (a pipeline across a
member and the returning one, asked through a third). Two removals at once, on two members, settle on one
key made without both removed nodes, which neither of them holds."""

import json
import os
import subprocess
import time
from pathlib import Path

import openai
import pytest

from conftest import MODEL_ID, ShoalNode, _binary
from test_cluster import http, place, wait_until

BOUND_S = 90
OLD_KEY = "python-tests"  # ShoalNode's --cluster-key


def members(node):
    status, body = http("GET", f"{node.url}/state")
    assert status == 200, body
    return sorted(n["id"] for n in body["cluster"]["nodes"])


def ring(node):
    """The node's key ring file (None when it has none yet)."""
    path = Path(node.state_dir) / "cluster-keys.json"
    if not path.exists():
        return None
    assert os.stat(path).st_mode & 0o777 == 0o600, "the key ring is private"
    return json.loads(path.read_text())


def stays_out(outsider, insiders, seconds=3.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert members(outsider) == [outsider.id], f"{outsider.id} got in"
        for n in insiders:
            assert outsider.id not in members(n), f"{n.id} let {outsider.id} in"
        time.sleep(0.2)


@pytest.mark.usefixtures("bounded")
def test_removal_rotates_the_key_and_a_returning_member_gets_the_new_one():
    a = ShoalNode("--no-auto-instance")
    b = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr)
    c = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr)
    d = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr)
    stranger = e = None
    nodes = (a, b, c, d)
    try:
        everyone = sorted(n.id for n in nodes)
        wait_until("all four to meet", lambda: all(members(n) == everyone for n in nodes), timeout=30)
        wait_until("every ring to know the members", lambda: all(
            (r := ring(n)) and r["current"] == {"epoch": 0, "key": OLD_KEY} and sorted(r["members"]) == everyone
            for n in nodes), timeout=15)

        # d is away while c is removed.
        d.kill()
        wait_until("a and b to drop d", lambda: members(a) == members(b) == sorted([a.id, b.id, c.id]))
        out = subprocess.run([str(_binary()), "remove", c.id, "--url", a.url],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and c.id in out.stdout, out.stderr
        rest = sorted([a.id, b.id])
        wait_until("a and b to drop c", lambda: members(a) == rest and members(b) == rest, timeout=15)
        wait_until("a and b to hold one new key at epoch 1", lambda: ring(a)["current"]["epoch"] == 1
                   and ring(a)["current"] == ring(b)["current"], timeout=15)
        ra, rb = ring(a), ring(b)
        new = ra["current"]
        assert rb["current"] == new, "one key everywhere"
        assert new["key"] != OLD_KEY and len(new["key"]) == 64
        assert {"epoch": 0, "key": OLD_KEY} in ra["previous"], "the old key stays only for returning members"
        assert ra["excludes"] == [c.id] and c.id not in ra["members"]
        assert ring(c)["current"] == {"epoch": 0, "key": OLD_KEY}, "the removed node never saw the new key"

        # The removed node comes back with the old key it still holds, pointed at a member: refused.
        c.restart()
        stays_out(c, (a, b))
        assert ring(c)["current"]["epoch"] == 0
        # A new identity made with the old key: the old key admits only known members.
        stranger = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr)
        stays_out(stranger, (a, b))
        assert (ring(stranger) or {"current": {"epoch": 0}})["current"]["epoch"] == 0

        # d returns with its old key: let in by its identity, handed the new key, in the cluster again.
        d.start()
        back = sorted([a.id, b.id, d.id])
        wait_until("d to rejoin with the new key", lambda: all(members(n) == back for n in (a, b, d))
                   and ring(d)["current"] == ring(a)["current"] == ring(b)["current"], timeout=30)
        assert ring(d)["current"]["epoch"] >= 1
        assert ring(d)["current"]["key"] != OLD_KEY
        # d restarted once more comes straight back with the key it now holds.
        d.restart()
        wait_until("d to come back on the new key", lambda: all(members(n) == back for n in (a, b, d)),
                   timeout=30)

        # A machine invited now is handed the new key (and takes the cluster's epoch from its members).
        token = subprocess.run([str(_binary()), "invite", "--state-dir", a.state_dir, "--url", a.url],
                               capture_output=True, text=True, timeout=30)
        assert token.returncode == 0, token.stderr
        e = ShoalNode("--no-auto-instance", "--join", token.stdout.strip(), key=None)
        joined = sorted([a.id, b.id, d.id, e.id])
        wait_until("e to join on the new key", lambda: all(members(n) == joined for n in (a, b, d, e))
                   and ring(e)["current"] == ring(a)["current"], timeout=30)

        # Serving works across the new key: a pipeline over a and d (the data plane's handshake names the
        # cluster by the current key), asked through b (relayed with the current key's proof).
        place(b, [(a, 15), (d, 15)])
        client = openai.OpenAI(base_url=f"{b.url}/v1", api_key="unused", timeout=60)
        reply = client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
            temperature=0)
        assert reply.choices[0].message.content.strip(), reply
        stays_out(c, (a, b, d, e), seconds=0.5)
    finally:
        for n in (e, stranger, d, c, b, a):
            if n:
                n.kill()



@pytest.mark.usefixtures("bounded")
def test_two_removals_at_once_settle_on_one_key_neither_removed_node_holds():
    a = ShoalNode("--no-auto-instance")
    rest = [ShoalNode("--no-auto-instance", "--peer", a.cluster_addr) for _ in range(4)]
    b, c, x, y = rest
    nodes = (a, b, c, x, y)
    try:
        everyone = sorted(n.id for n in nodes)
        wait_until("all five to meet", lambda: all(members(n) == everyone for n in nodes), timeout=30)
        # x removed through a and y through b, at the same time.
        calls = [subprocess.Popen([str(_binary()), "remove", who.id, "--url", via.url], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for who, via in ((x, a), (y, b))]
        for call in calls:
            out, err = call.communicate(timeout=30)
            assert call.returncode == 0, err
        left = sorted([a.id, b.id, c.id])
        wait_until("one key made without both", lambda: all(members(n) == left for n in (a, b, c))
                   and ring(a)["current"] == ring(b)["current"] == ring(c)["current"]
                   and ring(a)["excludes"] == sorted([x.id, y.id]), timeout=20)
        final = ring(a)["current"]
        assert final["epoch"] >= 1
        for gone in (x, y):
            held = [ring(gone)["current"], *ring(gone)["previous"]]
            assert final not in held, f"{gone.id} holds the key made without it"
        # Settled: no further rotation (the coordinator's wait after hearing of a removal has passed).
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            assert all(ring(n)["current"] == final for n in (a, b, c)), "the key changed again"
            time.sleep(0.2)
    finally:
        for n in nodes:
            n.kill()
