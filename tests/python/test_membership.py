"""Who is in the cluster, with real `shoal` processes: nodes started without a key never join each other;
`shoal invite` makes a token that lets one machine join (single use by default, or several, or until it
expires); a used-up or expired token is refused with a clear error; a joined node that restarts with the
same token comes back; `shoal remove NODE` takes a node out and every member refuses it from then on."""

import json
import subprocess
import time
import urllib.request

from conftest import ShoalNode, _binary
from test_cluster import wait_until


def members(node):
    state = json.loads(urllib.request.urlopen(f"{node.url}/state", timeout=30).read())
    return sorted(n["id"] for n in state["cluster"]["nodes"])


def invite(node, *args):
    out = subprocess.run([str(_binary()), "invite", "--state-dir", node.state_dir, "--url", node.url, *args],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    assert token.startswith("shoal2:") and node.url in token, token
    return token


def join_fails(token, why):
    """A node started with `token` exits with an error that says `why`."""
    import tempfile

    out = subprocess.run([str(_binary()), "serve", "--no-mdns", "--join", token, "--state-dir",
                          tempfile.mkdtemp(prefix="shoal-test-state-"), "--api-port", "0",
                          "--cluster-listen", "127.0.0.1:0", "--no-auto-instance"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and why in out.stderr, out.stderr
    assert "refused the invite" in out.stderr, out.stderr


def test_keyless_nodes_stay_apart_and_a_single_use_invite_admits_one_machine():
    a = ShoalNode("--no-auto-instance", key=None)
    b = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr, key=None)
    c = None
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert members(a) == [a.id] and members(b) == [b.id], "keyless nodes must not join"
            time.sleep(0.2)
        token = invite(a)
        c = ShoalNode("--no-auto-instance", "--join", token, key=None)
        wait_until("c to join a", lambda: members(a) == sorted([a.id, c.id]))
        assert b.id not in members(c)
        # The token was for one machine: a second one is refused, and says why.
        join_fails(token, "no such invite")
        # The joined node restarts with the same (used-up) token and comes back with the key it got.
        c.restart()
        wait_until("c to rejoin a", lambda: members(a) == sorted([a.id, c.id]) and members(c) == members(a))
        bad = subprocess.run([str(_binary()), "serve", "--join", "nonsense", "--state-dir", c.state_dir],
                             capture_output=True, text=True, timeout=30)
        assert bad.returncode != 0 and "not a token" in bad.stderr, bad.stderr
    finally:
        for n in (c, b, a):
            if n:
                n.kill()


def test_reusable_and_expiring_invites():
    a = ShoalNode("--no-auto-instance", key=None)
    joined = []
    try:
        two = invite(a, "--uses", "2")
        short = invite(a, "--reusable", "--ttl", "1s")
        for _ in range(2):
            joined.append(ShoalNode("--no-auto-instance", "--join", two, key=None))
        wait_until("both to join", lambda: members(a) == sorted([a.id] + [n.id for n in joined]))
        join_fails(two, "no such invite")
        time.sleep(2.5)
        join_fails(short, "expired")
    finally:
        for n in [*joined, a]:
            n.kill()


def test_a_removed_node_is_refused_when_it_comes_back():
    a = ShoalNode("--no-auto-instance", key=None)
    b = c = None
    try:
        token = invite(a, "--uses", "2")
        b = ShoalNode("--no-auto-instance", "--join", token, key=None)
        c = ShoalNode("--no-auto-instance", "--join", token, key=None)
        everyone = sorted([a.id, b.id, c.id])
        wait_until("all three to meet", lambda: all(members(n) == everyone for n in (a, b, c)))
        out = subprocess.run([str(_binary()), "remove", c.id[-8:], "--url", a.url],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and c.id in out.stdout, out.stderr
        rest = sorted([a.id, b.id])
        wait_until("a and b to drop c", lambda: members(a) == rest and members(b) == rest)
        state = json.loads(urllib.request.urlopen(f"{b.url}/state", timeout=30).read())
        me = next(n for n in state["cluster"]["nodes"] if n["id"] == b.id)
        assert [r["id"] for r in me.get("removed", [])] == [c.id], "b adopted a's removal"
        # c comes back (same identity, same key): nobody lets it in.
        c.restart()
        wait_until("c to stay alone", lambda: members(c) == [c.id])
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            assert members(a) == rest and members(b) == rest, "a removed node must be refused"
            time.sleep(0.2)
        # Removing an unknown node or the node itself is refused with a clear message.
        for who, why in (("nobody-here", "no member"), (a.id, "cannot remove itself")):
            out = subprocess.run([str(_binary()), "remove", who, "--url", a.url],
                                 capture_output=True, text=True, timeout=30)
            assert out.returncode != 0 and why in out.stderr, out.stderr
    finally:
        for n in (c, b, a):
            if n:
                n.kill()
