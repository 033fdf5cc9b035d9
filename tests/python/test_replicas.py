"""Replicas and load balancing on real processes: two nodes each drive a one-node instance of the test
model (two replicas placed with `POST /instance {"replicas": 2}`), every request goes to node `a`, and a's
balancer spreads them over both instances (least queued work). Both engines serve (their counters in
`/state` → `engines` grow, a's `routing` counts both instances), every output equals its lone greedy run,
and removing b's instance while requests run ends none of them silently: each finishes whole or fails
with a clear error, and the next ones are all served by a. Replicas go on disjoint nodes, all or nothing.
Every wait polls real state against a deadline."""

import concurrent.futures

import openai
import pytest

from conftest import MODEL_ID, ShoalNode
from test_cluster import http, remove, state, wait_members, wait_until

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Name three colors.",
    "Give me a fun fact about octopuses.",
    "Describe a sunny day in one sentence.",
    "What is two plus two?",
    "Name a famous painter.",
]
MAX_TOKENS = 16
REQUEST_TIMEOUT_S = 120


def client(node: ShoalNode) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0, timeout=REQUEST_TIMEOUT_S)


def greedy(node: ShoalNode, prompt: str, max_tokens: int = MAX_TOKENS, ignore_eos: bool = False):
    r = client(node).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
        extra_body={"ignore_eos": True} if ignore_eos else None,
    )
    return r.choices[0].message.content, r.choices[0].finish_reason


def instances(node: ShoalNode) -> list:
    return [i for i in state(node)["cluster"]["instances"] if i["model"] == MODEL_ID]


def driven_by(node: ShoalNode, of: ShoalNode) -> str:
    """The id of the ready instance `of` drives, as `node` sees it."""
    ids = [i["id"] for i in instances(node) if i["stages"][0]["node"] == of.id and i["status"] == "ready"]
    assert len(ids) == 1, instances(node)
    return ids[0]


def generated(node: ShoalNode) -> int:
    """Tokens the node's engine for the model has generated (0 when it has none)."""
    return state(node)["engines"].get(MODEL_ID, {}).get("generated_tokens", 0)


def place_replicas(node: ShoalNode, count: int) -> list:
    """POST /instance with `replicas`; waits until every replica is ready and each driver serves it."""
    status, body = http("POST", f"{node.url}/instance", {"model": MODEL_ID, "replicas": count})
    assert status == 201, body
    placed = body["instances"]
    assert len(placed) == count, body
    ids = {r["id"] for r in placed}
    wait_until(f"{count} replicas to be ready", lambda: {
        i["id"] for i in instances(node) if i["status"] == "ready"} >= ids)
    return placed


@pytest.fixture(scope="module")
def pair():
    """a and b, each driving a one-node instance of the model (two replicas placed through a)."""
    a = ShoalNode("--no-auto-instance", key="replicas")
    b = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr, key="replicas")
    nodes = [a, b]
    try:
        wait_members(nodes, nodes)
        placed = place_replicas(a, 2)
        assert sorted(r["stages"][0]["node"] for r in placed) == sorted([a.id, b.id]), placed
        assert all(len(r["stages"]) == 1 for r in placed), placed
        # Each node's engine is registered once its instance is ready.
        wait_until("both engines registered", lambda: all(MODEL_ID in state(n)["engines"] for n in nodes))
        yield a, b
    finally:
        for n in nodes:
            n.kill()


def test_32_concurrent_requests_are_shared_by_both_replicas_and_match_lone_runs(pair):
    a, b = pair
    lone = {p: greedy(a, p) for p in PROMPTS}
    assert all(text for text, _ in lone.values())
    ia, ib = driven_by(a, a), driven_by(a, b)
    before = {n.id: generated(n) for n in pair}
    routed_before = state(a)["routing"]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(32)]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda p: greedy(a, p), prompts))
    for p, got in zip(prompts, results):
        assert got == lone[p], f"{p!r}: concurrent {got!r} != lone {lone[p]!r}"
    # Both engines generated tokens for this burst, and a's balancer sent a fair share to each.
    assert generated(a) > before[a.id] and generated(b) > before[b.id], (before, generated(a), generated(b))
    routing = state(a)["routing"]
    sent = {i: routing.get(i, {}).get("routed", 0) - routed_before.get(i, {}).get("routed", 0) for i in (ia, ib)}
    print(f"32 requests to a: {sent[ia]} served by a's instance, {sent[ib]} by b's")
    assert sent[ia] + sent[ib] == 32 and min(sent.values()) >= 8, sent
    wait_until("nothing in flight", lambda: all(r["in_flight"] == 0 for r in state(a)["routing"].values()), 10)


def test_removing_a_replica_mid_load_finishes_or_fails_its_requests_and_the_rest_go_to_the_other(pair):
    a, b = pair
    tokens = 48
    expected = {p: greedy(a, p, tokens, ignore_eos=True)[0] for p in PROMPTS}
    ib = driven_by(a, b)

    def one(p):
        try:
            return ("ok", greedy(a, p, tokens, ignore_eos=True))
        except openai.APIError as e:
            return ("error", str(e))

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(one, p) for p in prompts]
        # Once b's engine is working on a's requests, its instance is removed.
        wait_until("b to run some of the requests",
                   lambda: state(b)["engines"].get(MODEL_ID, {}).get("active_sequences", 0) > 0, 30)
        status, body = http("DELETE", f"{a.url}/instance/{ib}")
        assert status == 200 and body["deleted"], body
        done, pending = concurrent.futures.wait(futures, timeout=REQUEST_TIMEOUT_S)
        assert not pending, "a request hung after the instance was removed"
    outcomes = [f.result() for f in futures]
    finished = errors = 0
    for p, (kind, got) in zip(prompts, outcomes):
        if kind == "ok":
            text, reason = got
            assert reason == "length" and text == expected[p], f"{p!r} ended early or differs: {got!r}"
            finished += 1
        else:
            assert got, "an error without a message"
            print(f"  ended with an error: {got}")
            errors += 1
    print(f"removal mid-load: {finished} requests finished whole, {errors} ended with an error")
    wait_until("b's instance to leave every table", lambda: all(
        all(i["id"] != ib for i in instances(n)) for n in pair))
    # New requests go to a's instance only: b generates nothing more.
    b_before = generated(b)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        again = list(pool.map(lambda p: greedy(a, p), PROMPTS))
    assert all(text for text, _ in again)
    assert generated(b) == b_before, "b served a request after its instance was removed"
    assert MODEL_ID not in state(b)["engines"]


def test_replicas_are_placed_on_disjoint_nodes_all_or_nothing(pair):
    a, b = pair
    for i in instances(a):
        remove(a, i["id"])
    status, body = http("GET", f"{a.url}/instance/previews?model={MODEL_ID}&replicas=2")
    assert status == 200, body
    assert sorted(p["stages"][0]["node"] for p in body["replicas"]) == sorted([a.id, b.id])
    assert body["replicas"][0]["explanation"].startswith("replica 1 of 2"), body
    # Three do not fit on two nodes: refused, saying how many did, and nothing placed.
    status, body = http("POST", f"{a.url}/instance", {"model": MODEL_ID, "replicas": 3})
    assert status == 400 and "only 2 of 3 replicas" in body["error"]["message"], body
    assert instances(a) == []
    status, body = http("POST", f"{a.url}/instance", {"model": MODEL_ID, "replicas": 0})
    assert status == 400 and "'replicas' must be at least 1" in body["error"]["message"], body
    # Placed through b this time; requests to b spread over both replicas too.
    place_replicas(b, 2)
    wait_until("both engines registered", lambda: all(MODEL_ID in state(n)["engines"] for n in pair))
    before = {n.id: generated(n) for n in pair}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: greedy(b, p), PROMPTS * 2))
    assert all(generated(n) > before[n.id] for n in pair)


def test_regression_a_node_joining_while_placing_its_own_instance_keeps_serving():
    """`shoal serve` on a second node places its own instance, pinned, as its own coordinator before it
    has heard of the first node; adopting the first node's table (just as new) dropped it and the node hung
    at startup. Tables now merge without losing an instance (shoal-cluster's state/merge.rs) and serve places
    once (a lost instance would end it with an error): both nodes serve, each with its own replica."""
    a = ShoalNode(key="replicas-auto")
    nodes = [a]
    try:
        b = ShoalNode("--peer", a.cluster_addr, key="replicas-auto")
        nodes.append(b)
        wait_members(nodes, nodes)
        wait_until("one ready instance driven by each node", lambda: sorted(
            i["stages"][0]["node"] for i in instances(a) if i["status"] == "ready") == sorted([a.id, b.id]))
        assert greedy(b, PROMPTS[0])[0]
    finally:
        for n in nodes:
            n.kill()
