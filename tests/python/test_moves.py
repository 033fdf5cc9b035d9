"""Re-placement on real processes: an automatically placed instance moves to a node that joins and is
predicted faster, make-before-break: a request streaming during the move finishes whole, and the old
instance leaves only once it has drained.

The first node measures its compute at start (the kernels' probe, into a cache of its own). The joining node
is given figures three times the first node's (`serve --compute FILE`): two processes on one small machine
cannot be made reliably faster than each other by measurement (a neighbour's build halves a two-thread probe),
and what this test checks is the move, not the probe (test_measured checks the probe against real decoding)."""

import concurrent.futures
import json
import os
import tempfile

import openai

from conftest import MODEL_ID, ShoalNode
from test_cluster import state, wait_members, wait_until

PROMPT = "Count slowly from one to fifty, one number per line."


def client(node: ShoalNode) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0, timeout=300)


def ask(node: ShoalNode, max_tokens: int) -> tuple:
    r = client(node).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True},
    )
    return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens


def stream(node: ShoalNode, max_tokens: int) -> tuple:
    text, reason, count = "", None, 0
    for chunk in client(node).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True},
        stream=True,
    ):
        for choice in chunk.choices:
            if choice.delta.content:
                text += choice.delta.content
                count += 1
            reason = choice.finish_reason or reason
    return text, reason


def instances(node: ShoalNode) -> list:
    return [i for i in state(node)["cluster"]["instances"] if i["model"] == MODEL_ID]


def test_an_instance_moves_to_a_faster_node_that_joins_without_losing_a_request():
    cache = tempfile.mkdtemp(prefix="shoal-test-cache-")
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    slow = ShoalNode("--no-auto-instance", threads=1, env=env)
    nodes = [slow]
    try:
        # Placed on demand, automatically: the only member.
        reference = ask(slow, 160)
        assert reference[1] == "length" and reference[2] == 160, reference
        [first] = instances(slow)
        assert [s["node"] for s in first["stages"]] == [slow.id]

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            during = pool.submit(stream, slow, 160)
            measured = next(f for f in state(slow)["cluster"]["nodes"] if f["id"] == slow.id)["compute"]
            assert measured["weight_bytes_per_s"]["q4_1"] > 0, measured
            given = dict(measured, weight_bytes_per_s={k: 3 * v for k, v in measured["weight_bytes_per_s"].items()},
                         flops_per_s=3 * measured["flops_per_s"], threads=2)
            figures = os.path.join(cache, "fast-node-compute.json")
            with open(figures, "w") as f:
                json.dump(given, f)
            fast = ShoalNode("--no-auto-instance", "--peer", slow.cluster_addr, "--compute", figures, threads=2, env=env)
            nodes.append(fast)
            wait_members(nodes, nodes)

            def moved():
                insts = instances(fast)
                return len(insts) == 1 and insts[0]["id"] != first["id"] and insts[0]["status"] == "ready" \
                    and insts[0]["stages"][0]["node"] == fast.id and insts
            # Loading the new one, draining the old one (at most a few seconds after its last request).
            [after] = wait_until("the instance to move to the faster node", moved, 180)
            text, reason = during.result(timeout=300)
        # The request that was streaming while the instance moved finished whole, token for token.
        assert (text, reason) == reference[:2]
        assert after["predicted_token_latency_us"] < first["predicted_token_latency_us"]
        speeds = {f["id"]: f["compute"]["weight_bytes_per_s"]["q4_1"] for f in state(fast)["cluster"]["nodes"]}
        assert abs(speeds[fast.id] / speeds[slow.id] - 3) < 1e-6, speeds
        # Requests asked of either node are served by the new placement, with the same answer.
        for n in nodes:
            assert ask(n, 160) == reference
        # ... and counted in the new instance's published load (facts refresh on their own beat, so the
        # count is waited for rather than read once).
        def counted():
            load = next(f for f in state(fast)["cluster"]["nodes"] if f["id"] == fast.id)["load"].get(after["id"])
            return load is not None and load["finished"] >= 1 and load
        wait_until("the new instance's finished requests to be published", counted, 30)
    finally:
        for n in nodes:
            n.kill()
