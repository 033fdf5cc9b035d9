"""Chaos under load, the short pass of the test command (issue 30; `scripts/chaos` is the long one):
concurrent greedy streams through a pipeline of real `shoal serve` processes while faults hit it, one at a
time and then overlapping — a stage SIGSTOPped for 5 s then SIGCONTed; a stage SIGKILLed; a stage stopped
while another is killed; the coordinator killed and started again as itself; a node killed while it
fetches a model from its peers; a node's KV budget filled past what the requests need; in the network lab,
a stage's link cut for 5 s and restored. Every request either finishes with exactly the tokens of its lone
run or ends with a clear error, none hangs past its deadline, none is cut short as if it had finished, the
cluster serves a request again within 10 s of the fault's end, and what the fault touched comes back: the
node rejoins as itself, the coordinator is the same, one instance, no ghost member. The counts and recovery
times are printed (docs/reliability.md records a run)."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import chaos
from chaos import REQUEST_DEADLINE_S, judge, stream_one
from conftest import LAB, MODEL_ID, ShoalNode, lab_namespaces, _models_dir
from test_cluster import http, place, remove, state, wait_members, wait_until
from test_transfer import CHUNK, FILE, SIZE, sha256

# 16 in the test command; `scripts/chaos` runs the same faults at 64 (SHOAL_CHAOS_STREAMS).
STREAMS = int(os.environ.get("SHOAL_CHAOS_STREAMS", "16"))
MAX_TOKENS = 48
RECOVERY_S = 10
# Every node sends f32 activations: a pipeline placed again on other nodes gives the same tokens.
F32 = ("--no-auto-instance", "--wire-dtype", "f32")


def under_fault(a: ShoalNode, fault) -> "list[dict]":
    """STREAMS requests at once to `a`; `fault()` runs once they are all under way."""
    return chaos.streams(a.url, range(STREAMS), MAX_TOKENS, started=fault)


def serves_again(a: ShoalNode, since: float, alone0) -> float:
    """Seconds from `since` (wall clock) until a streamed greedy request gives the lone run's tokens."""
    return chaos.probe(a.url, MAX_TOKENS, alone0, RECOVERY_S + 30) - since


def recovered(counts: dict, lasted: float = 0):
    """The cluster served the streams a fault cut again within RECOVERY_S of the fault's end (it `lasted`
    seconds): every one had tokens flowing again."""
    if "flowing_again_s" in counts:
        assert counts["flowing_again_s"] < lasted + RECOVERY_S, counts


def lone_runs(url: str) -> "list[list[str]]":
    out = []
    for k in range(STREAMS):
        r = stream_one(url, k, MAX_TOKENS)
        assert r["error"] is None and r["tokens"], r
        out.append(r["tokens"])
    return out


def one_instance_on(node: ShoalNode, members) -> dict:
    """Waits until `node` lists exactly `members`, one ready instance on them, and returns it."""
    ids = sorted(n.id for n in members)
    seen = {}

    def settled():
        c = seen["cluster"] = state(node)["cluster"]
        insts = c["instances"]
        return (
            sorted(x["id"] for x in c["nodes"]) == ids and len(insts) == 1 and insts[0]["status"] == "ready"
            and all(s["node"] in ids for s in insts[0]["stages"]) and insts[0]
        )

    try:
        return wait_until(f"one ready instance on {ids}", settled)
    except BaseException:
        c = seen.get("cluster", {})
        print("the cluster as", node.id, "sees it:", json.dumps({
            "coordinator": c.get("coordinator"), "nodes": [x["id"] for x in c.get("nodes", [])],
            "instances": [{k: i[k] for k in ("id", "status", "stages", "stage_status")}
                          for i in c.get("instances", [])]}, indent=1))
        raise


def place_again(a: ShoalNode, stages):
    for i in state(a)["cluster"]["instances"]:
        remove(a, i["id"])
    return place(a, stages)


def start_nodes(n: int, first_args=(), **kw) -> "list[ShoalNode]":
    a = ShoalNode(*F32, *first_args, **kw)
    nodes = [a]
    try:
        nodes += [ShoalNode(*F32, "--peer", a.cluster_addr, **kw) for _ in range(n - 1)]
    except BaseException:
        stop_nodes(nodes)
        raise
    return nodes


def stop_nodes(nodes):
    for n in nodes:
        try:
            n.proc.send_signal(signal.SIGCONT)
        except Exception:
            pass
        n.kill()


def stop_for_5_s(node: ShoalNode, at: dict, meanwhile=None):
    """SIGSTOP `node` (a laptop that sleeps) and SIGCONT it 5 s later; `meanwhile()` runs 1 s in. The
    times go in `at` (wall clock)."""
    node.proc.send_signal(signal.SIGSTOP)
    at["stopped"] = time.time()
    if meanwhile:
        time.sleep(1)
        meanwhile()
    time.sleep(max(0.0, at["stopped"] + 5 - time.time()))
    node.proc.send_signal(signal.SIGCONT)
    at["continued"] = time.time()


@pytest.fixture
def pipeline():
    # Model uploads limited to 10 MB/s a node, so a fetch from the three takes seconds (the data plane's
    # activations are not limited).
    nodes = start_nodes(3, ("--upload-limit", "10"))
    try:
        wait_members(nodes, nodes)
        yield nodes
    finally:
        stop_nodes(nodes)


def test_streams_under_a_stopped_a_killed_and_a_stopped_while_another_is_killed_stage(pipeline):
    a, b, c = pipeline
    place(a, [(a, 10), (b, 10), (c, 10)])
    alone = lone_runs(a.url)

    # 1. A stage stopped for 5 s (a laptop that sleeps), then continued.
    at = {}
    stopped = judge(under_fault(a, lambda: stop_for_5_s(b, at)), alone, "SIGSTOP 5 s", at["stopped"])
    back = serves_again(a, at["continued"], alone[0])
    print(f"SIGSTOP 5 s of a stage: {stopped}; a new request served {back:.1f} s after SIGCONT")
    recovered(stopped, 5)

    # 2. A stage killed: the instance is placed again on the two left and every stream continues there.
    wait_members(pipeline, pipeline)
    if not any(i["status"] == "ready" and len(i["stages"]) == 3 for i in state(a)["cluster"]["instances"]):
        place_again(a, [(a, 10), (b, 10), (c, 10)])
    killed = {}

    def kill_c():
        c.kill()
        killed["at"] = time.time()

    counts = judge(under_fault(a, kill_c), alone, "SIGKILL", killed["at"])
    back = serves_again(a, killed["at"], alone[0])
    print(f"SIGKILL of a stage: {counts}; a new request served {back:.1f} s after the kill")
    recovered(counts)
    # Every stream through the killed stage continued on the instance placed again (resume), each with
    # exactly its lone run's tokens: none lost, repeated or ended.
    assert counts["completed"] == STREAMS, counts

    # 3. Overlapping: b stopped for 5 s and, a second into it, c (restarted as itself) killed again —
    # two of the three stages gone at once, the driver alone left to hold the model.
    c.start()
    wait_members(pipeline, pipeline)
    place_again(a, [(a, 10), (b, 10), (c, 10)])

    both = judge(under_fault(a, lambda: stop_for_5_s(b, at, meanwhile=c.kill)), alone, "SIGSTOP + SIGKILL",
                 at["stopped"])
    back = serves_again(a, at["continued"], alone[0])
    print(f"SIGSTOP 5 s of a stage while another is SIGKILLed: {both}; a new request served {back:.1f} s after "
          f"SIGCONT")
    recovered(both, 5)
    # b comes back; the cluster is a and b, one instance, no ghost of c.
    one_instance_on(a, [a, b])
    wait_members([a, b], [a, b])


def around_the_coordinator(pipeline):
    """The coordinator (the smallest node id), the driver and the third node of `pipeline`, the model placed
    over them with the coordinator in the middle, the lone runs of the prompts, and the coordinator told to
    dial the driver when it starts again."""
    coordinator = state(pipeline[0])["cluster"]["coordinator"]
    victim = next(n for n in pipeline if n.id == coordinator)
    driver, third = [n for n in pipeline if n is not victim]
    place(driver, [(driver, 10), (victim, 10), (third, 10)])
    alone = lone_runs(driver.url)
    if "--peer" not in victim.args:
        victim.args += ["--peer", driver.cluster_addr]
    return victim, driver, third, alone


def test_the_coordinator_killed_and_started_again_under_load(pipeline):
    """The coordinator (the smallest node id) is a stage; it is SIGKILLed under load and started again at
    once with its state dir. Streams continue on the instance the next coordinator places again; the node
    rejoins as itself and is the coordinator again; one instance, three members, everywhere."""
    victim, driver, _, alone = around_the_coordinator(pipeline)
    coordinator = victim.id
    at = {}

    def restart():
        victim.kill()
        at["killed"] = time.time()
        victim.start()
        at["started"] = time.time()

    counts = judge(under_fault(driver, restart), alone, "coordinator restart", at["killed"])
    assert victim.id == coordinator
    back = serves_again(driver, at["killed"], alone[0])
    print(f"coordinator SIGKILLed and started again ({at['started'] - at['killed']:.1f} s): {counts}; "
          f"a new request served {back:.1f} s after the kill")
    recovered(counts)
    assert counts["completed"] == STREAMS, counts
    wait_members(pipeline, pipeline)
    t = time.time()
    for n in pipeline:
        wait_until(f"{n.id} to name {coordinator} coordinator again",
                   lambda n=n: state(n)["cluster"]["coordinator"] == coordinator)
        one_instance_on(n, pipeline)
    print(f"  the restarted coordinator is coordinator again everywhere {time.time() - t:.1f} s after rejoining")
    assert serves_again(driver, time.time(), alone[0]) < RECOVERY_S, "an idle cluster serves at once"


def download(node: ShoalNode, of: ShoalNode) -> "dict | None":
    status, body = http("GET", f"{node.url}/downloads")
    assert status == 200, body
    return next((d for d in body["nodes"].get(of.id, []) if d["model"] == MODEL_ID), None)


def test_a_node_killed_mid_download_under_load_resumes_and_the_cluster_keeps_serving(pipeline, tmp_path):
    """A fourth node fetches the model from the three (10 MB/s each) while they serve; it is SIGKILLed a
    quarter of the way. The streams are untouched; started again with its state and models dir, the node
    fetches only what it lacked and the file is exact."""
    a, b, c = pipeline
    place(a, [(a, 10), (b, 10), (c, 10)])
    alone = lone_runs(a.url)
    gemma = sorted((_models_dir() / "gemma3-270m-q4_k_m").glob("*.gguf"))
    assert gemma, "the Gemma test model is missing: scripts/test pulls it"
    e = ShoalNode("--no-auto-instance", "--model", str(gemma[0]), "--peer", a.cluster_addr, models_dir=tmp_path)
    try:
        wait_members(pipeline + [e], pipeline + [e])
        at = {}

        def kill_e_mid_download():
            # Started once the streams run (so it is under way when they are), killed a quarter through.
            assert http("POST", f"{e.url}/downloads", {"model": MODEL_ID})[0] == 202
            d = wait_until("a quarter of the file",
                           lambda: (lambda d: d and d["state"] == "running" and d["done"] >= SIZE // 4 and d)(
                               download(e, e)))
            e.kill()
            at["killed"], at["done"] = time.time(), d["done"]

        counts = judge(under_fault(a, kill_e_mid_download), alone, "download killed", at["killed"])
        assert counts["completed"] == STREAMS, counts
        back = serves_again(a, at["killed"], alone[0])
        wait_members(pipeline, pipeline)
        partial = list((tmp_path / MODEL_ID).glob("*.partial"))
        assert partial, "the killed download left nothing to resume from"
        e.start()
        wait_members(pipeline + [e], pipeline + [e])
        t = time.time()
        assert http("POST", f"{e.url}/downloads", {"model": MODEL_ID})[0] == 202

        def finished():
            d = download(e, e)
            assert d is None or d["state"] != "failed", d
            return d and d["state"] == "done" and d

        done = wait_until("the download started again", finished, 120)
        fetched = sum(done["sources"].values())
        print(f"a node SIGKILLed {at['done'] / SIZE:.0%} into a model download: {counts}; a new request served "
              f"{back:.1f} s after the kill; started again, it fetched the {fetched / 1e6:.0f} MB left in "
              f"{time.time() - t:.1f} s")
        assert fetched <= SIZE - at["done"] + 2 * CHUNK, (at, done)
        assert sha256(tmp_path / MODEL_ID / FILE) == sha256(_models_dir() / MODEL_ID / FILE)
        assert not list((tmp_path / MODEL_ID).glob("*.partial"))
    finally:
        e.kill()


def test_a_full_kv_budget_queues_or_refuses_every_request_clearly(pipeline):
    """A node with 4 MiB of KV hosts half the model: the pipeline holds ~364 tokens, a quarter of what
    STREAMS requests need at once. Each request finishes with its lone run's tokens (admission queues it)
    or is refused with a clear 400 when it could never fit; none hangs; the pipeline serves after."""
    a = pipeline[0]
    place(a, [(a, 30)])
    alone = lone_runs(a.url)
    small = ShoalNode(*F32, "--kv-budget-mib", "4", "--peer", a.cluster_addr)
    try:
        wait_members([a], pipeline + [small])
        iid = place_again(a, [(a, 15), (small, 15)])
        capacity = state(a)["cluster"]["nodes"]
        capacity = next(n for n in capacity if n["id"] == small.id)["kv_capacity"][iid]
        need = sum(len(t) + 30 for t in alone)
        assert need > 2 * capacity, (need, capacity)
        t = time.time()
        too_long = {}

        def and_one_too_long():
            too_long.update(stream_one(a.url, -1, 8, text="word " * capacity))

        counts = judge(under_fault(a, and_one_too_long), alone, "KV budget full", None)
        took = time.time() - t
        print(f"KV budget of {capacity} tokens, {STREAMS} streams needing ~{need}: {counts} in {took:.1f} s; "
              f"a prompt longer than the budget: {too_long['error']}")
        assert counts["completed"] == STREAMS, counts
        # Refused at once with a clear error that names the limit.
        assert too_long["error"] and f"{capacity} tokens" in too_long["error"] and not too_long["tokens"], too_long
        assert serves_again(a, time.time(), alone[0]) < RECOVERY_S
    finally:
        small.kill()


PREFIX = "shoal-chaos-"
CHAOS = str(Path(chaos.__file__).resolve())


@pytest.fixture
def lab():
    with lab_namespaces(3, PREFIX, "--profile", "ethernet") as ns:
        yield ns


def in_ns(node: ShoalNode, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", node.netns, "python3", CHAOS, *args],
                            stdout=subprocess.PIPE, text=True, **kw)


def lab_streams(node: ShoalNode, ks, fault=None) -> "list[dict]":
    p = in_ns(node, "streams", node.url, str(MAX_TOKENS), *map(str, ks))
    try:
        assert p.stdout.readline().strip() == "started"
        if fault:
            fault()
        out, _ = p.communicate(timeout=REQUEST_DEADLINE_S + 30)
    finally:
        p.kill()
    assert p.returncode == 0, out
    return json.loads(out)


def lab_serves_again(node: ShoalNode, since: float, alone0) -> float:
    p = in_ns(node, "probe", node.url, str(MAX_TOKENS), json.dumps(alone0), str(RECOVERY_S + 30))
    out, _ = p.communicate(timeout=RECOVERY_S + 60)
    assert p.returncode == 0, out
    return json.loads(out) - since


def test_a_stage_link_cut_for_5_s_in_the_lab_and_restored(lab):
    """Three nodes in lab namespaces (ethernet profile); the link of the third stage is pulled at the
    bridge for 5 s (longer than a peer may stay silent) under load, then restored. The streams continue on
    the instance placed again without it; the node comes back as itself, one instance, no ghost."""
    cut_under_load(lab, 5)


def cut_under_load(lab, seconds: float):
    """A pipeline over the lab's three nodes; the third stage's link cut for `seconds` while STREAMS stream,
    then restored. Every stream finishes with its lone run's tokens, flowing again within RECOVERY_S of the
    cut; the three are members again with one ready instance."""
    import test_eight_nodes as eight

    addr = [subprocess.run([LAB, "addr", "--prefix", PREFIX, str(i)], check=True, capture_output=True,
                           text=True).stdout.strip() for i in range(3)]
    a = ShoalNode(*F32, host=addr[0], netns=lab[0])
    nodes = [a]
    try:
        nodes += [ShoalNode(*F32, "--peer", a.cluster_addr, host=addr[i], netns=lab[i]) for i in (1, 2)]
        eight.lab_members(nodes, nodes)
        iid = eight.lab_place(a, [(n, 10) for n in nodes])
        alone = [r["tokens"] for r in sorted(lab_streams(a, range(STREAMS)), key=lambda r: r["k"])]
        at = {}

        def cut_c():
            subprocess.run([LAB, "cut", "--prefix", PREFIX, "2"], check=True, capture_output=True)
            at["cut"] = time.time()
            time.sleep(seconds)
            subprocess.run([LAB, "restore", "--prefix", PREFIX, "2"], check=True, capture_output=True)
            at["restored"] = time.time()

        counts = judge(lab_streams(a, range(STREAMS), cut_c), alone, f"link cut {seconds:g} s", at["cut"])
        back = lab_serves_again(a, at["cut"], alone[0])
        kept = [i["id"] for i in eight.lab_cluster(a)["instances"]] == [iid]
        print(f"link of a stage cut for {seconds:g} s in the lab: {counts}; a new request served {back:.1f} s "
              f"after the cut; instance {'kept' if kept else 'placed again'}")
        # Within 10 s of the fault's end, as for the 5 s SIGSTOP: the restore (a debug build on a 2-core AVX2
        # VM replays the 16 streams' KV 10.9 s after the cut; a release build 5.5 s, docs/reliability.md).
        recovered(counts, seconds)
        assert counts["completed"] == STREAMS, counts
        eight.lab_members(nodes, nodes)
        print(f"  the cut node is a member again {time.time() - at['restored']:.1f} s after the restore")
        for n in nodes:
            insts = eight.lab_cluster(n)["instances"]
            assert len(insts) == 1 and insts[0]["status"] == "ready", insts
    finally:
        for n in nodes:
            n.kill()
