"""Cluster behaviour on real interfaces: two nodes in network namespaces of `scripts/lab` (veth + bridge)
find each other by mDNS alone, classify their link, and notice a cut link. Needs root (CI and dev machines
have it); without root the test fails with that reason rather than skipping."""

import json
import subprocess
import time

import pytest

from conftest import LAB, ShoalNode, lab_namespaces
from test_cluster import wait_until

PREFIX = "shoal-pytest-"


@pytest.fixture(scope="module")
def lab():
    with lab_namespaces(2, PREFIX, "--profile", "ethernet") as ns:
        yield ns


def addr(i: int) -> str:
    return subprocess.run([LAB, "addr", "--prefix", PREFIX, str(i)], check=True, capture_output=True,
                          text=True).stdout.strip()


def cluster(node):
    """GET /state from inside the node's namespace (the lab is not reachable from the host's)."""
    code = f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('{node.url}/state', timeout=5).read().decode())"
    out = subprocess.run(["ip", "netns", "exec", node.netns, "python3", "-c", code], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["cluster"]


def test_mdns_discovery_link_kind_and_a_cut_link(lab):
    nodes = [ShoalNode("--no-auto-instance", host=addr(i), netns=ns, mdns=True) for i, ns in enumerate(lab)]
    a, b = nodes
    try:
        # No --peer anywhere: only multicast DNS can bring them together.
        for n in nodes:
            try:
                wait_until(f"{n.id} to see both nodes by mDNS",
                           lambda n=n: sorted(x["id"] for x in cluster(n)["nodes"]) == sorted([a.id, b.id]))
            except BaseException:
                for m in nodes:
                    print(f"--- {m.id} stderr:\n{m.stderr_tail()}")
                raise
        # Links are published at connection time and refreshed every second (with the ping RTT).
        links = wait_until("the link's RTT to be published",
                           lambda: [l for l in cluster(a)["links"] if l["rtt_us"] is not None])
        assert len(links) == 1 and links[0]["kind"] == "ethernet", links
        assert links[0]["rtt_us"] is not None and links[0]["rtt_us"] > 0, links
        subprocess.run(["ip", "-n", lab[1], "link", "set", "eth0", "down"], check=True)
        t0 = time.monotonic()
        wait_until("a to drop b after the link is cut", lambda: [x["id"] for x in cluster(a)["nodes"]] == [a.id],
                   timeout=20)
        print(f"cut link noticed after {(time.monotonic() - t0) * 1000:.0f} ms")
    finally:
        for n in nodes:
            n.kill()
