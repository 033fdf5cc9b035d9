"""`shoal doctor`: on loopback, two nodes see each other reachable with round trips, bandwidth, path MTU and
clock offset, a killed peer is reported unreachable (exit status 1), and no node at the URL is a problem
with the hint to start one while this machine's part is still shown. In the network lab (root, netns
via scripts/lab): a link limited to 40 Mbit/s by tc tbf shows that bandwidth each way within 20%, and
once the link is cut the peer is reported unreachable with a non-zero exit status."""

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ShoalNode, _binary, lab_namespaces
from test_cluster import wait_members, wait_until

PREFIX = "shoal-pytest-doctor-"
RATE_BPS = 40e6
TBF = ["rate", "40mbit", "burst", "32kb", "latency", "50ms"]


def doctor(url: str, *extra: str, netns: "str | None" = None, timeout: float = 120) -> "tuple[int, dict]":
    """Runs `shoal doctor --json` (inside `netns` when given); its exit status and report."""
    cmd = [str(_binary()), "doctor", "--url", url, "--json", *extra]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert p.stdout.strip(), f"no report; stderr:\n{p.stderr}"
    return p.returncode, json.loads(p.stdout)


def peer_of(report: dict, node: ShoalNode) -> dict:
    peers = {p["id"]: p for p in report["peers"]}
    assert node.id in peers, report["peers"]
    return peers[node.id]


def test_loopback_peers_are_measured_and_a_killed_one_is_unreachable():
    a = ShoalNode("--no-auto-instance", key="doctor-loopback")
    b = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr, key="doctor-loopback")
    try:
        wait_members([a, b], [a, b])
        status, report = doctor(a.url, "--pings", "20", "--transfer-ms", "500")
        p = peer_of(report, b)
        assert p["reachable"] and p["pings_answered"] == 20 and p["loss"] == 0, p
        assert p["link_kind"] == "loopback" and p["name"], p
        name = p["name"]
        assert 0 < p["rtt_p50_ms"] <= p["rtt_p99_ms"] < 1000, p
        assert p["up_bps"] > 1e6 and p["down_bps"] > 1e6, p
        # The route's MTU, as IPv4 can carry it (lo's 65536 reads as 65535).
        assert p["mtu"] == min(int(Path("/sys/class/net/lo/mtu").read_text()), 65535), p
        assert abs(p["clock_offset_ms"]) < 50, "one machine, one clock"
        assert report["node"]["id"] == a.id
        assert report["local"]["cores"] >= 1 and report["local"]["simd"]
        assert any(m["id"] == "smollm2-135m-instruct-q4_1" and m["state"] == "complete"
                   for m in report["local"]["models"]), report["local"]["models"]
        assert not [x for x in report["problems"] if x["severity"] == "error"], report["problems"]
        assert status == 0 and report["ok"]

        b.kill()
        wait_until("a to lose b", lambda: b.id not in [n["id"] for n in _state(a)["cluster"]["nodes"]])
        status, report = doctor(a.url, "--pings", "5", "--transfer-ms", "200")
        p = peer_of(report, b)
        assert not p["reachable"], p
        assert p["name"] == name, "a lost peer keeps its name"
        assert p["errors"][0].startswith("no connection: lost "), p
        assert status == 1 and not report["ok"]
        unreachable = [x for x in report["problems"] if x["what"].startswith("peer ") and "is unreachable" in x["what"]]
        assert len(unreachable) == 1 and unreachable[0]["severity"] == "error", report["problems"]
        assert unreachable[0]["hint"].startswith("check that `shoal serve` runs there")
    finally:
        a.kill()
        b.kill()


def test_no_node_at_the_url_is_a_problem_and_this_machine_is_still_reported():
    url = "http://127.0.0.1:9"  # the discard port: nothing listens there
    status, report = doctor(url)
    assert status == 1 and not report["ok"]
    assert report["peers"] is None and report["node"] is None
    assert report["problems"][0] == {
        "severity": "error",
        "what": f"no shoal node answers at {url}",
        "hint": "start one with `shoal serve` (or point --url at a running node)",
    }
    assert report["local"]["memory_total_bytes"] > 0
    text = subprocess.run([str(_binary()), "doctor", "--url", url], capture_output=True, text=True, timeout=60)
    assert text.returncode == 1
    assert f"cluster: no node answered at {url}\n" in text.stdout
    assert f"  error: no shoal node answers at {url}\n    hint: start one with `shoal serve`" in text.stdout


def _state(node: ShoalNode) -> dict:
    import urllib.request

    with urllib.request.urlopen(f"{node.url}/state", timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def lab():
    with lab_namespaces(2, PREFIX) as ns:
        for n in ns:
            subprocess.run(["tc", "-n", n, "qdisc", "replace", "dev", "eth0", "root", "tbf", *TBF], check=True)
        yield ns


def ns_state(node: ShoalNode) -> dict:
    script = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    out = subprocess.run(["ip", "netns", "exec", node.netns, "python3", "-c", script, f"{node.url}/state"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_tbf_limited_link_shows_its_bandwidth_and_a_cut_one_is_unreachable(lab):
    a = ShoalNode("--no-auto-instance", host="0.0.0.0", netns=lab[0])
    nodes = [a]
    try:
        port = re.search(r"/tcp/(\d+)", a.cluster_addr).group(1)
        b = ShoalNode("--no-auto-instance", "--peer", f"10.77.0.10:{port}", host="0.0.0.0", netns=lab[1])
        nodes.append(b)

        def b_linked_and_probed():
            me = next((n for n in ns_state(a)["cluster"]["nodes"] if n["id"] == a.id), None)
            links = [l for l in (me or {}).get("links", []) if l["peer"] == b.id]
            return links and links[0]["bandwidth_bps"] is not None

        # The link's own probe at connection time must be over before the doctor measures.
        wait_until("a to see b with its link probed", b_linked_and_probed, timeout=60)
        time.sleep(1.0)
        status, report = doctor(a.url, netns=lab[0])
        p = peer_of(report, b)
        print("doctor over the 40 Mbit/s link:", json.dumps(p))
        assert p["reachable"] and p["loss"] == 0, p
        assert p["addr"] == "10.77.0.11" and p["link_kind"] is not None, p
        for way in ("up_bps", "down_bps"):
            assert 0.8 * RATE_BPS <= p[way] <= 1.2 * RATE_BPS, f"{way} = {p[way] / 1e6:.1f} Mbit/s, want 40 ± 20%"
        mtu = int(subprocess.run(["ip", "netns", "exec", lab[0], "cat", "/sys/class/net/eth0/mtu"],
                                 capture_output=True, text=True, check=True).stdout)
        assert p["mtu"] == mtu, p
        assert status == 0 and report["ok"], report["problems"]

        subprocess.run(["ip", "-n", lab[1], "link", "set", "eth0", "down"], check=True)
        t0 = time.monotonic()
        status, report = doctor(a.url, "--pings", "10", netns=lab[0])
        print(f"doctor after the cut took {time.monotonic() - t0:.1f} s:", json.dumps(report["peers"]))
        p = peer_of(report, b)
        assert not p["reachable"], p
        assert status != 0 and not report["ok"]
        assert any(x["severity"] == "error" and "is unreachable" in x["what"] for x in report["problems"])
    finally:
        for n in nodes:
            n.kill()
