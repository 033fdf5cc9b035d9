"""Two paths between two nodes (`scripts/lab up 2 --paths 2`: eth0 on 10.77.0.0/24, eth1 on 10.78.0.0/24,
eth1 limited by tc tbf): a 2-node pipeline's hop runs on the faster path; when that path is cut, or
limited below the other, while a long greedy request streams through the pipeline, the request completes
with the same tokens as a lone run and `/state` shows the hop on the other path; when the path is back
(or unlimited), the hop moves back. Needs root (network namespaces); without it the test fails with that
reason rather than skipping."""

import json
import re
import subprocess
import time

import pytest

from conftest import MODEL_ID, ShoalNode, lab_namespaces
from test_cluster import wait_until

PREFIX = "shoal-pytest-paths-"
FAST, SLOW = "10.77.0.", "10.78.0."
# The slow path: 20 Mbit/s each way (a 64 KiB batch costs ~26 ms there, ~0.1 ms on the fast one).
SLOW_TBF = ["rate", "20mbit", "burst", "32kb", "latency", "50ms"]
# What "degrades" the fast path: 1 Mbit/s.
DEGRADED_TBF = ["rate", "1mbit", "burst", "8kb", "latency", "100ms"]
TOKENS = 600
PROMPT = "Write a long story about a lighthouse keeper and the sea."

CLIENT = r"""
import json, sys, urllib.request, urllib.error
method, url, body = sys.argv[1], sys.argv[2], sys.argv[3]
data = None if body == "-" else body.encode()
req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=float(sys.argv[4])) as r:
        print(json.dumps({"status": r.status, "body": json.loads(r.read() or b"null")}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": json.loads(e.read() or b"null")}))
"""


def ns_http(node, method, path, body=None, timeout=30):
    """An HTTP request from inside the node's namespace (the lab is not reachable from the host's)."""
    args = ["ip", "netns", "exec", node.netns, "python3", "-c", CLIENT, method, f"{node.url}{path}",
            "-" if body is None else json.dumps(body), str(timeout)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout + 30)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    return r["status"], r["body"]


def ns_http_background(node, path, body, timeout=300):
    args = ["ip", "netns", "exec", node.netns, "python3", "-c", CLIENT, "POST", f"{node.url}{path}",
            json.dumps(body), str(timeout)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def cluster(node):
    status, body = ns_http(node, "GET", "/state")
    assert status == 200, body
    return body["cluster"]


def link(node, peer):
    me = next(n for n in cluster(node)["nodes"] if n["id"] == node.id)
    return next((l for l in me["links"] if l["peer"] == peer.id), None)


def hop_path(driver, peer, iid):
    """The address of the path the driver's streams of instance `iid` to `peer` run on (None: none)."""
    l = link(driver, peer)
    on = [p["addr"] for p in (l or {}).get("paths", []) if iid in p.get("instances", [])]
    return on[0] if len(on) == 1 else None


def tbf(ns, dev, spec):
    subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", *spec], check=True)


def untbf(ns, dev):
    subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True)


def completion_body():
    return {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}


def complete(node):
    status, body = ns_http(node, "POST", "/v1/completions", completion_body(), timeout=300)
    assert status == 200, body
    return body["choices"][0]["text"]


def request_through(node, lone, disturb):
    """A long request streaming through `node`'s pipeline while `disturb` runs: it must give the lone
    run's text. Returns the seconds from the disturbance to its end."""
    proc = ns_http_background(node, "/v1/completions", completion_body())
    wait_until("the request to be running", lambda: any(
        x.get("running", 0) > 0 for n in cluster(node)["nodes"] if n["id"] == node.id
        for x in n.get("load", {}).values()), timeout=30)
    time.sleep(0.5)
    t0 = time.monotonic()
    disturb()
    out, err = proc.communicate(timeout=300)
    r = json.loads(out)
    assert r["status"] == 200, r
    assert r["body"]["choices"][0]["text"] == lone, "the request's tokens changed"
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def lab():
    yield from two_path_lab(2, PREFIX)


def two_path_lab(nodes: int, prefix: str):
    """`nodes` namespaces joined on two paths, eth1 limited to SLOW_TBF; torn down after."""
    with lab_namespaces(nodes, prefix, "--paths", "2") as ns:
        for n in ns:
            tbf(n, "eth1", SLOW_TBF)
        yield ns


def test_the_hop_takes_the_better_path_and_moves_when_it_is_cut_or_limited(lab):
    a = ShoalNode("--no-auto-instance", host="0.0.0.0", netns=lab[0])
    nodes = [a]
    try:
        port = re.search(r"/tcp/(\d+)", a.cluster_addr).group(1)
        b = ShoalNode("--no-auto-instance", "--peer", f"{FAST}10:{port}", "--peer", f"{SLOW}10:{port}",
                      host="0.0.0.0", netns=lab[1])
        nodes.append(b)

        def both_paths_measured():
            l = link(a, b)
            paths = (l or {}).get("paths", [])
            addrs = sorted(p["addr"] for p in paths)
            if addrs != [f"{FAST}11", f"{SLOW}11"] or any(p["bandwidth_bps"] is None for p in paths):
                return None
            return paths

        paths = wait_until("two measured paths from a to b", both_paths_measured)
        print("paths a -> b:", paths)
        fast = next(p for p in paths if p["addr"].startswith(FAST))
        slow = next(p for p in paths if p["addr"].startswith(SLOW))
        assert fast["preferred"] and not slow["preferred"], paths
        assert fast["bandwidth_bps"] > 2 * slow["bandwidth_bps"], paths
        # The link the planner sees is the preferred path's.
        assert link(a, b)["bandwidth_bps"] == fast["bandwidth_bps"]

        status, body = ns_http(a, "POST", "/instance", {"model": MODEL_ID, "nodes": [a.id, b.id], "layers": [15, 15]})
        assert status == 201, body
        iid = body["id"]
        wait_until("the instance to be ready",
                   lambda: any(i["id"] == iid and i["status"] == "ready" for i in cluster(a)["instances"]))
        lone = wait_until("the model to answer", lambda: complete(a))
        assert hop_path(a, b, iid) == f"{FAST}11"

        def through(disturb, restore, want_during, want_after):
            """A long request in flight while `disturb` runs: same text, and the hop on `want_during`;
            then `restore`, a request, and the hop on `want_after`."""
            took = request_through(a, lone, disturb)
            print(f"request completed {took:.1f} s after the disturbance")
            wait_until(f"the hop on {want_during}", lambda: hop_path(a, b, iid) == want_during)
            restore()
            # The hop moves between steps: requests until it did (each must give the same text).
            def moved_back():
                assert complete(a) == lone
                return hop_path(a, b, iid) == want_after
            wait_until(f"the hop back on {want_after}", moved_back, timeout=90)

        # Cut the fast path on b's side (a's probes and pings on it fail; b stays a member over eth1).
        through(lambda: subprocess.run(["ip", "-n", lab[1], "link", "set", "eth0", "down"], check=True),
                lambda: subprocess.run(["ip", "-n", lab[1], "link", "set", "eth0", "up"], check=True),
                f"{SLOW}11", f"{FAST}11")
        assert sorted(x["id"] for x in cluster(a)["nodes"]) == sorted([a.id, b.id]), "b stayed a member"

        # Limit the fast path below the slow one (both directions), then lift the limit.
        def degrade():
            for n in lab:
                tbf(n, "eth0", DEGRADED_TBF)

        def lift():
            for n in lab:
                untbf(n, "eth0")

        through(degrade, lift, f"{SLOW}11", f"{FAST}11")
    finally:
        for n in nodes:
            n.kill()


@pytest.fixture(scope="module")
def lab3():
    yield from two_path_lab(3, PREFIX + "3-")


def test_a_hop_between_two_stage_nodes_moves_when_its_path_is_cut(lab3):
    """A 3-node pipeline a → b → c: the fast path between b and c alone is cut (a blackhole route on
    each side; a's paths stay up) while a long greedy request streams. The break travels up the
    pipeline (c's stream from b ends b's thread, which closes a's lane to b), a sends again what was
    unconfirmed, b opens its stream to c on the path left: the request completes token for token and
    b's link to c shows the hop on the slow path. When the fast path is back, b's stream to c (not
    cut, only no longer on b's preferred path) ends so the pipeline opens again there (`PathMoved`),
    with every request's tokens unchanged."""
    a = ShoalNode("--no-auto-instance", host="0.0.0.0", netns=lab3[0])
    nodes = [a]
    try:
        port = re.search(r"/tcp/(\d+)", a.cluster_addr).group(1)
        peers = ["--peer", f"{FAST}10:{port}", "--peer", f"{SLOW}10:{port}"]
        b = ShoalNode("--no-auto-instance", *peers, host="0.0.0.0", netns=lab3[1])
        nodes.append(b)
        c = ShoalNode("--no-auto-instance", *peers, host="0.0.0.0", netns=lab3[2])
        nodes.append(c)

        def two_paths(x, y):
            paths = (link(x, y) or {}).get("paths", [])
            return len(paths) == 2 and all(p["bandwidth_bps"] is not None for p in paths) and paths

        wait_until("two measured paths from b to c", lambda: two_paths(b, c), timeout=120)
        wait_until("two measured paths from a to b", lambda: two_paths(a, b), timeout=120)
        status, body = ns_http(a, "POST", "/instance",
                               {"model": MODEL_ID, "nodes": [a.id, b.id, c.id], "layers": [10, 10, 10]})
        assert status == 201, body
        iid = body["id"]
        wait_until("the instance to be ready",
                   lambda: any(i["id"] == iid and i["status"] == "ready" for i in cluster(a)["instances"]),
                   timeout=180)
        lone = wait_until("the model to answer", lambda: complete(a))
        assert hop_path(b, c, iid) == f"{FAST}12", link(b, c)
        driver_paths = (hop_path(a, b, iid), hop_path(a, c, iid))

        def blackhole(op):
            """Only b <-> c on the fast path: a reaches both of them there still."""
            subprocess.run(["ip", "-n", lab3[1], "route", op, "blackhole", f"{FAST}12/32"], check=True)
            subprocess.run(["ip", "-n", lab3[2], "route", op, "blackhole", f"{FAST}11/32"], check=True)

        took = request_through(a, lone, lambda: blackhole("add"))
        print(f"request completed {took:.1f} s after the cut")
        wait_until("b's hop to c on the slow path", lambda: hop_path(b, c, iid) == f"{SLOW}12")
        assert (hop_path(a, b, iid), hop_path(a, c, iid)) == driver_paths, "a's own paths were not cut"
        assert complete(a) == lone
        assert sorted(x["id"] for x in cluster(a)["nodes"]) == sorted([a.id, b.id, c.id])

        # The fast path back: b's hop to c returns to it, between requests or under one.
        request_through(a, lone, lambda: blackhole("del"))

        def moved_back():
            assert complete(a) == lone
            return hop_path(b, c, iid) == f"{FAST}12"
        wait_until("b's hop to c back on the fast path", moved_back, timeout=120)
        assert (hop_path(a, b, iid), hop_path(a, c, iid)) == driver_paths
    finally:
        for n in nodes:
            n.kill()
