"""Chaos under load, the faults only the long pass runs (`scripts/chaos`; not collected by the test command,
whose `tests/python/test_chaos.py` holds the rest): a stage's link cut for 1 s in the lab (shorter than a
peer may stay silent); a node killed while its stage of a new instance downloads the layers it lacks, with
requests waiting for that instance; the coordinator killed while it is also the driver (the streams it
holds end with an error: the one fault no stream survives) and started again; the coordinator restarted
while another stage is SIGSTOPped. The same rules as `test_chaos.py`: every request finishes with its lone
run's tokens or ends with a clear error, none hangs, the cluster serves again within 10 s."""

import concurrent.futures
import time

import chaos
from chaos import judge, stream_one
from conftest import MODEL_ID, ShoalNode, _models_dir
from test_chaos import (  # noqa: F401 (fixtures)
    F32, MAX_TOKENS, RECOVERY_S, STREAMS, around_the_coordinator, cut_under_load, lab, lone_runs, one_instance_on,
    pipeline, recovered, serves_again, stop_for_5_s, under_fault,
)
from test_cluster import http, place, state, wait_members, wait_until


def test_a_stage_link_cut_for_1_s_in_the_lab(lab):
    """A cut about as long as the silence after which a peer is dropped (1.6 s of no pong): the nodes drop
    each other at different moments, or not at all."""
    cut_under_load(lab, 1)


def test_a_node_killed_while_its_stage_downloads_its_layers(pipeline, tmp_path):
    """e lacks the model; an instance is placed over a, b and e, so e fetches its layers from the three
    (10 MB/s each) while requests wait for the instance; e is SIGKILLed mid-download. The instance is
    placed again on the members and every waiting request is served with its lone run's tokens, or ends
    with a clear error."""
    a, b, c = pipeline
    iid = place(a, [(a, 30)])
    alone = lone_runs(a.url)
    http("DELETE", f"{a.url}/instance/{iid}")
    gemma = sorted((_models_dir() / "gemma3-270m-q4_k_m").glob("*.gguf"))
    e = ShoalNode("--no-auto-instance", "--model", str(gemma[0]), "--peer", a.cluster_addr, models_dir=tmp_path)
    try:
        wait_members(pipeline + [e], pipeline + [e])
        status, body = http("POST", f"{a.url}/instance",
                            # e takes most of the layers, so its fetch (30 MB/s from the three) lasts ~2 s
                            # and is still running when it is killed a second after the requests start.
                            {"model": MODEL_ID, "nodes": [a.id, b.id, e.id], "layers": [4, 4, 22]})
        assert status == 201, body

        def e_downloading():
            # e's own view: its facts reach the others only with the next gossip, after a fast fetch ended.
            inst = next((i for i in state(e)["cluster"]["instances"] if i["id"] == body["id"]), None)
            st = inst and inst["stage_status"][2]
            return st and st["state"] == "downloading" and st["done"] > 0

        wait_until("e's stage to download", e_downloading, 60)
        with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
            futures = [pool.submit(stream_one, a.url, k, MAX_TOKENS) for k in range(STREAMS)]
            time.sleep(1)
            e.kill()
            killed = time.time()
            results = [f.result(timeout=chaos.REQUEST_DEADLINE_S + 30) for f in futures]
        counts = judge(results, alone, "stage killed mid-download", killed)
        back = serves_again(a, killed, alone[0])
        print(f"a node SIGKILLed while its stage downloads, {STREAMS} requests waiting: {counts}; "
              f"a new request served {back:.1f} s after the kill")
        assert back < RECOVERY_S + max(r["s"] for r in results)
        one_instance_on(a, pipeline)
    finally:
        e.kill()


def test_the_coordinator_that_drives_killed_and_started_again(pipeline):
    """The driver is the coordinator: its streams die with it (each ends with an error, after a prefix
    of its lone run); started again as itself, it is coordinator again and the model served again."""
    coordinator = state(pipeline[0])["cluster"]["coordinator"]
    victim = next(n for n in pipeline if n.id == coordinator)
    others = [n for n in pipeline if n is not victim]
    place(victim, [(victim, 10), (others[0], 10), (others[1], 10)])
    alone = lone_runs(victim.url)
    if "--peer" not in victim.args:
        victim.args += ["--peer", others[0].cluster_addr]
    at = {}

    def restart():
        victim.kill()
        at["killed"] = time.time()
        victim.start()

    counts = judge(under_fault(victim, restart), alone, "driving coordinator restart", at["killed"])
    wait_members(pipeline, pipeline)
    for n in pipeline:
        wait_until("the coordinator back", lambda n=n: state(n)["cluster"]["coordinator"] == coordinator)
    # The model is served again from the restarted node (its instance placed again by whoever coordinated).
    back = chaos.probe(victim.url, MAX_TOKENS, alone[0], RECOVERY_S + 60) - at["killed"]
    print(f"the coordinator that drives SIGKILLed and started again: {counts}; a new request served {back:.1f} s "
          f"after the kill")
    assert counts["errored"] + counts["completed"] == STREAMS
    assert back < RECOVERY_S + 5


def test_the_coordinator_restarted_while_another_stage_is_stopped(pipeline):
    """Overlapping: the stage that is not the coordinator nor the driver is SIGSTOPped for 5 s, and a
    second in, the coordinator (a stage) is SIGKILLed and started again."""
    victim, driver, sleeper, alone = around_the_coordinator(pipeline)
    at = {}

    def restart():
        victim.kill()
        victim.start()

    counts = judge(under_fault(driver, lambda: stop_for_5_s(sleeper, at, meanwhile=restart)), alone,
                   "SIGSTOP + coordinator restart", at["stopped"])
    back = serves_again(driver, at["continued"], alone[0])
    print(f"a stage SIGSTOPped 5 s while the coordinator restarts: {counts}; a new request served {back:.1f} s "
          f"after SIGCONT")
    recovered(counts, 5)
    wait_members(pipeline, pipeline)
    for n in pipeline:
        one_instance_on(n, pipeline)
