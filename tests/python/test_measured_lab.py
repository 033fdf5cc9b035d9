"""Measured next to predicted on the network lab's profiles: the same check as test_measured.py (a one-node
instance and a 2-node pipeline of the test model, one thread per node, a few greedy requests one at a time;
the measured one-stream decode rate within TOLERANCE of the planner's prediction at the requests' context),
with the two nodes in network namespaces of `scripts/lab`, joined by veth links shaped to the `ethernet`
(tbf 1 Gbit/s) and `wifi` (tbf 200 Mbit/s) profiles. The nodes measure the link (RTT and bandwidth) and
their compute themselves, and the prediction prices the hop from those measurements.

The profiles' one-way latency is not applied here: this kernel has no netem, and the delaying proxy sits in
front of one address, not between every pair of ports two nodes use (docs/lab.md). So the wifi profile here
is its bandwidth (a token's 2.3 KiB of activations take ~90 us at 200 Mbit/s, ~20 us at 1 Gbit/s), not its
2 ms.

Seen here (2-core VM, debug build, 2026-11-25, one run): ethernet 0.76 one node, 0.52 two nodes; wifi 0.95
and 0.85 (the test prints them with `pytest -s`). The tolerance and the reasons for its width are
test_measured.py's; two nodes read lowest because the debug build spends a few ms per token more in a
2-node pipeline than in one node (the release build ~0.1 ms), which the cost model does not price. Needs root (network namespaces); without it the test
fails with that reason rather than skipping."""

import os
import re
import subprocess
import tempfile

import pytest

from conftest import LAB, ShoalNode
from test_cluster import wait_until
from test_measured import TOLERANCE, measured_against_predicted
from test_paths import ns_http

PREFIX = "shoal-pytest-measured-"
SUBNET = "10.77.0."


def in_namespace(node: ShoalNode, method: str, path: str, body=None):
    """A request to a node's HTTP API from inside its namespace (the lab is not routed to the host)."""
    return ns_http(node, method, path, body, timeout=120)


@pytest.fixture(scope="module", params=["ethernet", "wifi"])
def lab_duo(request):
    profile = request.param
    if os.geteuid() != 0:
        pytest.fail("the lab tests need root (network namespaces): run them as root", pytrace=False)
    subprocess.run([LAB, "down", "--prefix", PREFIX], check=True, capture_output=True)
    subprocess.run([LAB, "up", "2", "--profile", profile, "--prefix", PREFIX], check=True, capture_output=True)
    env = dict(os.environ, XDG_CACHE_HOME=tempfile.mkdtemp(prefix="shoal-test-cache-"))
    nodes = []
    try:
        a = ShoalNode("--no-auto-instance", host="0.0.0.0", netns=f"{PREFIX}0", env=env)
        nodes.append(a)
        port = re.search(r"/tcp/(\d+)", a.cluster_addr).group(1)
        b = ShoalNode("--no-auto-instance", "--peer", f"{SUBNET}10:{port}", host="0.0.0.0",
                      netns=f"{PREFIX}1", env=env)
        nodes.append(b)

        def measured_link():
            _, st = in_namespace(a, "GET", "/state")
            me = next((n for n in st["cluster"]["nodes"] if n["id"] == a.id), None)
            l = next((l for l in (me or {}).get("links", []) if l["peer"] == b.id), None)
            return l if l and l.get("bandwidth_bps") and l.get("rtt_us") else None

        link = wait_until(f"a's measured link to b ({profile})", measured_link)
        print(f"\n{profile}: a -> b measured rtt {link['rtt_us']} us, {link['bandwidth_bps'] / 1e6:.0f} Mbit/s")
        yield profile, a, b
    finally:
        for n in nodes:
            n.kill()
        subprocess.run([LAB, "down", "--prefix", PREFIX], capture_output=True)


@pytest.mark.parametrize("layout", ["one node", "two nodes"])
def test_measured_agrees_with_the_prediction_on_the_lab_profiles(lab_duo, layout):
    profile, a, b = lab_duo
    stages = [(a, 30)] if layout == "one node" else [(a, 15), (b, 15)]
    ratio = measured_against_predicted(in_namespace, a, b, stages, f"{profile}, {layout}")
    assert TOLERANCE[0] <= ratio <= TOLERANCE[1], \
        f"{profile}, {layout}: measured / predicted {ratio:.2f}, tolerance {TOLERANCE}"
