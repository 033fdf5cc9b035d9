"""Measured next to predicted, on real processes: a one-node instance and a 2-node pipeline of the test model
(one thread per node, loopback). Each instance's driver publishes its load in its facts once it is ready —
nothing of its warm-up counted — and `/state` shows it as `measured` beside the planner's `predicted`; after a
few greedy requests run one at a time, the measured one-stream decode rate agrees with the predicted one
within the tolerance below; a removed instance's load is no longer published.

The tolerance is what the cost model achieves today on this model, stated honestly. The prediction streams each
layer's weights at the node's probed rate (plus the hops) and leaves out the output head, attention, sampling
and the engine's per-token work; the probe is taken once (cached per binary, CPU and thread count) under
whatever load the machine had then, and the requests run under the load of the moment. Seen on a shared
2-core machine (load average 3-8; debug build, one thread per node; 8 runs over two probes, one predicting
27 tok/s and one 36): measured / predicted 0.44-1.55, one node and two alike; a probe cached while six builds
ran predicted 16 tok/s and the run measured 34 (2.07). So the nodes here measure their compute afresh, into a
cache of their own, when the test starts them, and the range is 0.25-4: it catches a cost model off by an
order or a unit, not the noise of a shared box; the tight agreement on the lab profiles is still to be shown.
The ratios are printed (`pytest -s`)."""

import os
import tempfile
import time

import pytest

from conftest import MODEL_ID, ShoalNode
from test_cluster import client, place, remove, state, wait_members, wait_until

# measured / predicted one-stream decode tok/s must lie in this range.
TOLERANCE = (0.25, 4.0)
REQUESTS = 4
TOKENS = 48


@pytest.fixture(scope="module")
def duo():
    # A compute cache of their own: the probe is measured now, not taken from an earlier, busier moment.
    env = dict(os.environ, XDG_CACHE_HOME=tempfile.mkdtemp(prefix="shoal-test-cache-"))
    a = ShoalNode("--no-auto-instance", key="measured-figures", env=env)
    b = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr, key="measured-figures", env=env)
    nodes = [a, b]
    try:
        wait_members(nodes, nodes)
        yield a, b
    finally:
        for n in nodes:
            n.kill()


def view_of(node: ShoalNode, iid: str) -> dict:
    insts = [i for i in state(node)["cluster"]["instances"] if i["id"] == iid]
    assert insts, f"instance {iid} vanished"
    return insts[0]


def load_published(node: ShoalNode, iid: str) -> bool:
    me = next(n for n in state(node)["cluster"]["nodes"] if n["id"] == node.id)
    return iid in me.get("load", {})


def complete(node: ShoalNode, k: int) -> int:
    def go():
        try:
            return client(node).completions.create(
                model=MODEL_ID, prompt=f"Write a long story about lighthouse keeper number {k}.",
                max_tokens=TOKENS, temperature=0, extra_body={"ignore_eos": True})
        except Exception as e:  # the engine may still be registering right after `ready`
            if "404" in str(e):
                return None
            raise

    r = wait_until("the model to be served", go)
    return r.usage.completion_tokens


@pytest.mark.parametrize("layout", ["one node", "two nodes"])
def test_measured_decode_rate_is_published_and_agrees_with_the_prediction(duo, layout):
    a, b = duo
    stages = [(a, 30)] if layout == "one node" else [(a, 15), (b, 15)]
    iid = place(a, stages)
    try:
        # Published once ready, with nothing counted yet: the warm-up is not the instance's work.
        measured = wait_until("the driver's load", lambda: view_of(a, iid)["measured"])
        assert (measured["finished"], measured["running"], measured["queued"]) == (0, 0, 0), measured
        assert measured["decode_tok_s"] is None and measured["ttft_ms"] is None, measured
        # Shown the same on the other member.
        wait_until("b to show a's load", lambda: view_of(b, iid)["measured"] is not None)
        predicted = view_of(a, iid)["predicted"]["decode_tok_s"]
        assert predicted and predicted > 0, view_of(a, iid)["predicted"]

        started = time.monotonic()
        for k in range(REQUESTS):
            assert complete(a, k) == TOKENS
        wall = time.monotonic() - started
        done = wait_until("the finished requests to be published",
                          lambda: (m := view_of(a, iid)["measured"]) and m["finished"] >= REQUESTS and m)
        assert done["finished"] == REQUESTS and done["running"] == 0 and done["queued"] == 0, done
        rate, ttft = done["decode_tok_s"], done["ttft_ms"]
        # Each request decoded TOKENS - 1 tokens after its first within the time the client waited, and
        # its first token came before that: so does any average of them.
        assert rate >= (TOKENS - 1) / wall, (rate, wall)
        assert 0 < ttft < wall * 1e3, (ttft, wall)
        ratio = rate / predicted
        print(f"\n{layout}: measured {rate:.1f} tok/s, predicted {predicted:.1f} tok/s, ratio {ratio:.2f}; "
              f"TTFT {ttft:.1f} ms")
        assert TOLERANCE[0] <= ratio <= TOLERANCE[1], \
            f"measured {rate:.1f} tok/s vs predicted {predicted:.1f} (ratio {ratio:.2f}, tolerance {TOLERANCE})"
    finally:
        remove(a, iid)
    wait_until("the removed instance's load to be withdrawn", lambda: not load_published(a, iid))
