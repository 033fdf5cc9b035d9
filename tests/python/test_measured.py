"""Measured next to predicted, on real processes: a one-node instance and a 2-node pipeline of the test model
(one thread per node, loopback). Each instance's driver publishes its load in its facts once it is ready —
nothing of its warm-up counted — and `/state` shows it as `measured` beside the planner's `predicted` (and its
figures term by term in `prediction`); after a few greedy requests run one at a time, the measured one-stream
decode rate agrees with the predicted one within the tolerance below; a removed instance's load is no longer
published. The output head is priced on the last stage only.

The prediction is compared at the context these requests decoded at (their prompt plus half the generated
tokens): the planner prices attention at its own default context (prompt 512 + 128) and says what each token
of context adds, so the test moves the figure exactly to its own context.

The tolerance is what the cost model achieves on this model, with a margin for a busy 2-core box, stated
honestly. The prediction prices every layer's weights streamed at the node's probed rate for their type, the
output head at the probed rate for its type, attention at the probed attention rate and sampling at the probed
pass rate (plus the hops); it leaves out that the kernels run ~10-15 % slower on SmolLM2's small matrices than
on the probe's large one, and each step's small operations (norms, rope, quantizing activations: ~6 %). Seen
here (2-core VM, debug build, one thread per node, 2026-11-25): measured / predicted 0.66-0.88, one node and two
alike, over 6 runs at load average 4-6 (before the head, attention and sampling were priced: 0.44-1.55, and
~0.5 on a quiet machine). The probe is taken when the nodes start and the requests run a few seconds later, so
a machine whose load changes between the two moves the ratio: while a release build ran beside the test (load
8-10) it read 0.59-1.72. So the range was set to 0.5-1.5; then a full suite run (2026-11-25, debug build, nothing else
running) read 0.46 for two nodes: the two nodes' probes, a minute apart, measured Q4_1 at 10.3 and 4.9 GB/s,
and the planner took the faster figures for a run on a slower moment. The range is 0.4-1.5: it still fails a
model 2.5x optimistic or 1.5x pessimistic, not the noise of a shared box between probe and run. On an AMD EPYC
with AVX-512 (2026-11-28) it read 1.40-1.55, in CI too: the planner priced a lone token's layers at the batched
probe's flop rate, measured on Q4_0's batched kernel, which is three times slower there than Q4_1's decode
kernel; one token is now priced at its measured decode step (a batch is never slower than its tokens one at a
time), and the same machine reads 0.87-0.90. The nodes measure
their compute afresh, into a cache of their own, when the test starts them. The ratios are printed
(`pytest -s`)."""

import os
import tempfile
import time

import pytest

from conftest import MODEL_ID, ShoalNode
from test_cluster import http, wait_members, wait_until

# measured / predicted one-stream decode tok/s must lie in this range (see the module docstring).
TOLERANCE = (0.4, 1.5)
REQUESTS = 4
TOKENS = 48


def loopback(node: ShoalNode, method: str, path: str, body=None):
    """A request to a node's HTTP API from this process: (status, body)."""
    return http(method, f"{node.url}{path}", body)


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


def cluster_of(call, node: ShoalNode) -> dict:
    status, body = call(node, "GET", "/state")
    assert status == 200, body
    return body["cluster"]


def view_of(call, node: ShoalNode, iid: str) -> dict:
    insts = [i for i in cluster_of(call, node)["instances"] if i["id"] == iid]
    assert insts, f"instance {iid} vanished"
    return insts[0]


def load_published(call, node: ShoalNode, iid: str) -> bool:
    me = next(n for n in cluster_of(call, node)["nodes"] if n["id"] == node.id)
    return iid in me.get("load", {})


def at_context(predicted: dict, context: float) -> float:
    """The predicted one-stream tok/s at `context` cached tokens: the planner prices attention at its own
    context (`context_tokens`) and says what each token of context adds (`attention_us_per_token_of_context`)."""
    us = predicted["token_latency_us"] + (context - predicted["context_tokens"]) * \
        predicted["attention_us_per_token_of_context"]
    return 1e6 / us


def complete(call, node: ShoalNode, k: int) -> tuple[int, int]:
    body = {"model": MODEL_ID, "prompt": f"Write a long story about lighthouse keeper number {k}.",
            "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}

    def go():
        status, r = call(node, "POST", "/v1/completions", body)
        if status == 404:  # the engine may still be registering right after `ready`
            return None
        assert status == 200, r
        return r

    r = wait_until("the model to be served", go)
    return r["usage"]["completion_tokens"], r["usage"]["prompt_tokens"]


def measured_against_predicted(call, a: ShoalNode, b: ShoalNode, stages, label: str) -> float:
    """Places `stages` = [(node, layers), ...] through `a`, checks the published load before and after
    REQUESTS greedy requests run one at a time through `a`, removes the instance and returns the measured /
    predicted one-stream decode rate. `call(node, method, path, body)` reaches a node's HTTP API."""
    status, body = call(a, "POST", "/instance",
                        {"model": MODEL_ID, "nodes": [n.id for n, _ in stages], "layers": [k for _, k in stages]})
    assert status == 201, body
    iid = body["id"]
    try:
        def ready():
            view = view_of(call, a, iid)
            assert view["status"] != "failed", view
            return view["status"] == "ready"

        wait_until(f"instance {iid} to be ready", ready)
        # Published once ready, with nothing counted yet: the warm-up is not the instance's work.
        measured = wait_until("the driver's load", lambda: view_of(call, a, iid)["measured"])
        assert (measured["finished"], measured["running"], measured["queued"]) == (0, 0, 0), measured
        assert measured["decode_tok_s"] is None and measured["ttft_ms"] is None, measured
        # Shown the same on the other member.
        wait_until("b to show a's load", lambda: view_of(call, b, iid)["measured"] is not None)
        view = view_of(call, a, iid)
        figures = view["prediction"]  # the planner's figures, term by term
        assert view["predicted"]["decode_tok_s"] == pytest.approx(figures["decode_tok_s"]), view
        assert figures["decode_tok_s"] > 0 and figures["context_tokens"] > 0, figures
        last = figures["stages"][-1]
        assert last["head_us"] > 0, f"the output head is priced on the last stage: {figures}"
        assert all(s["head_us"] == 0 for s in figures["stages"][:-1]), figures

        started = time.monotonic()
        prompts = []
        for k in range(REQUESTS):
            generated, prompt = complete(call, a, k)
            assert generated == TOKENS
            prompts.append(prompt)
        wall = time.monotonic() - started
        # Attention priced where these requests decoded: the prompt plus half the generated tokens.
        context = sum(prompts) / len(prompts) + TOKENS / 2
        predicted = at_context(figures, context)
        done = wait_until("the finished requests to be published",
                          lambda: (m := view_of(call, a, iid)["measured"]) and m["finished"] >= REQUESTS and m)
        assert done["finished"] == REQUESTS and done["running"] == 0 and done["queued"] == 0, done
        rate, ttft = done["decode_tok_s"], done["ttft_ms"]
        # Each request decoded TOKENS - 1 tokens after its first within the time the client waited, and
        # its first token came before that: so does any average of them.
        assert rate >= (TOKENS - 1) / wall, (rate, wall)
        assert 0 < ttft < wall * 1e3, (ttft, wall)
        ratio = rate / predicted
        hops = sum(h["token_us"] for h in figures["hops"]) + figures["return_us"]
        print(f"\n{label}: measured {rate:.1f} tok/s, predicted {predicted:.1f} tok/s at {context:.0f} tokens "
              f"of context ({figures['decode_tok_s']:.1f} at {figures['context_tokens']}), ratio {ratio:.2f}; "
              f"head {last['head_us']:.0f} us, hops {hops:.0f} us; TTFT {ttft:.1f} ms")
        return ratio
    finally:
        status, body = call(a, "DELETE", f"/instance/{iid}")
        assert status == 200 and body["deleted"], body
        wait_until("the removed instance's load to be withdrawn", lambda: not load_published(call, a, iid))


@pytest.mark.parametrize("layout", ["one node", "two nodes"])
def test_measured_decode_rate_is_published_and_agrees_with_the_prediction(duo, layout):
    a, b = duo
    stages = [(a, 30)] if layout == "one node" else [(a, 15), (b, 15)]
    ratio = measured_against_predicted(loopback, a, b, stages, layout)
    assert TOLERANCE[0] <= ratio <= TOLERANCE[1], f"measured / predicted {ratio:.2f}, tolerance {TOLERANCE}"
