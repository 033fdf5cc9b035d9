"""Models between real `shoal serve` processes on 127.0.0.1: a node without a model fetches it from the
peers that have it (several at once, each chunk verified), offers it afterwards and serves the same greedy
tokens; a stage placed on a node that lacks the model fetches only its own layers' bytes; a copy that went
bad on one peer is refused chunk by chunk and fetched from another; a cancelled download resumes with only
the rest; a peer killed mid-transfer leaves the rest to another. Every wait polls real state against a
deadline."""

import hashlib
import json
import os
import shutil
import subprocess

import pytest

from conftest import GEMMA_ID, MODEL_ID, ShoalNode, _binary, _models_dir
from test_cluster import greedy, http, place, remove, state, wait_members, wait_until

SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE = 98_362_432
CHUNK = 4 << 20
PROMPTS = ["What is the capital of France?", "List three prime numbers."]


def model_file():
    return _models_dir() / MODEL_ID / FILE


def gemma_file():
    found = sorted((_models_dir() / GEMMA_ID).glob("*.gguf"))
    assert found, f"{GEMMA_ID} is not in {_models_dir()}: scripts/test pulls it"
    return found[0]


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def store_with_a_copy(tmp_path_factory, name):
    """A models dir holding its own copy of the SmolLM2 file."""
    d = tmp_path_factory.mktemp(name)
    (d / MODEL_ID).mkdir()
    shutil.copyfile(model_file(), d / MODEL_ID / FILE)
    return d


def downloads(node, of=None):
    """`of`'s downloads (default: `node`'s own) as `node`'s /downloads lists them."""
    status, body = http("GET", f"{node.url}/downloads")
    assert status == 200, body
    return body["nodes"].get((of or node).id, [])


def finished(node, model=MODEL_ID):
    """The download of `model` on `node` once it is done (a failed one fails the test; a cancelled one
    may still be listed until a new run of the same download is published)."""
    for d in downloads(node):
        if d["model"] == model:
            assert d["state"] != "failed", d
            if d["state"] == "done":
                return d
    return None


def running_past(node, fraction, model=MODEL_ID, sources=1):
    """The running download of `model` on `node` once it has `fraction` of the file from at least
    `sources` sources; else None."""
    for d in downloads(node):
        if d["model"] == model and d["state"] == "running":
            serving = [v for v in d["sources"].values() if v > 0]
            if d["done"] >= SIZE * fraction and len(serving) >= sources:
                return d
    return None


def offered(node, model=MODEL_ID):
    me = next(n for n in state(node)["cluster"]["nodes"] if n["id"] == node.id)
    return any(m["id"] == model for m in me["models"])


@pytest.fixture(scope="module")
def holders(tmp_path_factory):
    """Two nodes that have the model (each its own copy), f32 activations on a's pipelines."""
    a = ShoalNode("--no-auto-instance", "--wire-dtype", "f32", key="transfer-tests")
    b_dir = store_with_a_copy(tmp_path_factory, "b-models")
    b = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr, key="transfer-tests", models_dir=b_dir)
    try:
        wait_members([a, b], [a, b])
        yield a, b, b_dir
    finally:
        a.kill()
        b.kill()


def lacking_node(holders, tmp_path_factory, name, *args, key="transfer-tests"):
    """A node serving Gemma (by path) whose models dir lacks SmolLM2."""
    a = holders[0]
    d = tmp_path_factory.mktemp(name)
    node = ShoalNode("--no-auto-instance", "--model", str(gemma_file()), "--peer", a.cluster_addr, *args,
                     key=key, models_dir=d)
    return node, d


def test_a_node_fetches_a_model_from_two_peers_at_once_then_offers_and_serves_it(holders, tmp_path_factory):
    a, b, _ = holders
    c, c_dir = lacking_node(holders, tmp_path_factory, "c-models")
    try:
        wait_members([a, b, c], [a, b, c])
        assert not offered(c)
        status, body = http("POST", f"{c.url}/downloads", {"model": MODEL_ID})
        assert status == 202, body
        done = wait_until("c's download to end", lambda: finished(c))
        assert done["needed"] == done["file_size"] == SIZE and done["done"] == SIZE, done
        assert done["refused_chunks"] == 0, done
        # Both peers served chunks; the bytes add up to the file.
        assert len(done["sources"]) == 2 and all(v > 0 for v in done["sources"].values()), done
        assert sum(done["sources"].values()) == SIZE, done
        assert sha256(c_dir / MODEL_ID / FILE) == SHA256
        assert not list((c_dir / MODEL_ID).glob("*.partial"))
        # Every node sees c's download, and c now offers the model: it can run it alone.
        assert any(d["model"] == MODEL_ID and d["state"] == "done" for d in downloads(a, of=c))
        wait_until("c to offer the model", lambda: offered(c))
        alone = place(a, [(a, 30)])
        want = [greedy(a, p)[:2] for p in PROMPTS]
        remove(a, alone)
        on_c = place(c, [(c, 30)])
        assert [greedy(c, p)[:2] for p in PROMPTS] == want
        remove(c, on_c)
        # Bad requests are clear.
        status, body = http("POST", f"{c.url}/downloads", {"model": ""})
        assert status == 400, body
        status, body = http("DELETE", f"{c.url}/downloads/{MODEL_ID}")
        assert status == 404 and "no running download" in body["error"]["message"], body
    finally:
        c.kill()


def test_serve_fetches_its_missing_model_from_a_peer_before_the_internet(holders, tmp_path_factory):
    a, _, _ = holders
    d = tmp_path_factory.mktemp("fresh-models")
    fresh = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr, key="transfer-tests", models_dir=d)
    try:
        got = wait_until("fresh's download in its facts", lambda: finished(fresh))
        assert all(name.startswith("peer ") for name in got["sources"]), got
        assert sha256(d / MODEL_ID / FILE) == SHA256
    finally:
        fresh.kill()


def test_a_stage_on_a_node_without_the_model_fetches_only_its_layers(holders, tmp_path_factory):
    a, _, _ = holders
    e, e_dir = lacking_node(holders, tmp_path_factory, "e-models")
    try:
        wait_members([e], [a, holders[1], e])
        alone = place(a, [(a, 30)])
        want = [greedy(a, p)[:2] for p in PROMPTS]
        remove(a, alone)
        # e holds layers 20..30 and the head (tied to the embedding): it fetches those bytes only.
        split = place(a, [(a, 20), (e, 10)])
        got = wait_until("e's download in its facts", lambda: finished(e))
        assert got["file_size"] == SIZE and got["needed"] < 0.75 * SIZE, got
        assert got["done"] == got["needed"], got
        assert [greedy(a, p)[:2] for p in PROMPTS] == want
        remove(a, split)
        # The sparse file is not a model: e does not offer it and `shoal models` says it is partial.
        assert list((e_dir / MODEL_ID).glob("*.partial"))
        assert not offered(e)
        listing = subprocess.run([str(_binary()), "models", "--models-dir", str(e_dir)],
                                 capture_output=True, text=True, timeout=30)
        line = next(l for l in listing.stdout.splitlines() if MODEL_ID in l)
        assert "partial" in line, listing.stdout
    finally:
        e.kill()


def test_cancel_then_resume_fetches_only_the_rest(tmp_path_factory):
    # An upload-limited holder in a cluster of its own, so the download takes seconds.
    h = ShoalNode("--no-auto-instance", "--upload-limit", "20", key="transfer-cancel")
    d = tmp_path_factory.mktemp("f-models")
    f = ShoalNode("--no-auto-instance", "--model", str(gemma_file()), "--peer", h.cluster_addr,
                  key="transfer-cancel", models_dir=d)
    try:
        wait_members([h, f], [h, f])
        assert http("POST", f"{f.url}/downloads", {"model": MODEL_ID})[0] == 202

        wait_until("a quarter of the file", lambda: running_past(f, 0.25))
        status, body = http("DELETE", f"{f.url}/downloads/{MODEL_ID}")
        assert status == 200 and body["state"] == "cancelled", body
        cancelled = wait_until("the cancel", lambda: next(
            (x for x in downloads(f) if x["model"] == MODEL_ID and x["state"] == "cancelled"), None))
        assert 0 < cancelled["done"] < SIZE, cancelled
        assert list((d / MODEL_ID).glob("*.partial")) and not offered(f)
        assert http("POST", f"{f.url}/downloads", {"model": MODEL_ID})[0] == 202
        done = wait_until("the resumed download", lambda: finished(f), timeout=120)
        fetched_again = sum(done["sources"].values())
        assert fetched_again <= SIZE - cancelled["done"] + CHUNK, json.dumps([cancelled, done]) + f.stderr_tail()
        assert sha256(d / MODEL_ID / FILE) == SHA256
    finally:
        f.kill()
        h.kill()


def test_a_peer_dying_mid_transfer_leaves_the_rest_to_another(tmp_path_factory):
    h1 = ShoalNode("--no-auto-instance", "--upload-limit", "15", key="transfer-dying")
    h2 = ShoalNode("--no-auto-instance", "--upload-limit", "15", "--peer", h1.cluster_addr,
                   key="transfer-dying")
    d = tmp_path_factory.mktemp("g-models")
    g = ShoalNode("--no-auto-instance", "--model", str(gemma_file()), "--peer", h1.cluster_addr,
                  key="transfer-dying", models_dir=d)
    try:
        wait_members([h1, h2, g], [h1, h2, g])
        assert http("POST", f"{g.url}/downloads", {"model": MODEL_ID})[0] == 202

        wait_until("both holders to serve a quarter", lambda: running_past(g, 0.25, sources=2))
        h1.kill()
        done = wait_until("the download after h1 died", lambda: finished(g), timeout=120)
        by_h2 = done["sources"][f"peer {h2.id}"]
        assert by_h2 > SIZE // 2, json.dumps(done) + g.stderr_tail()
        assert sha256(d / MODEL_ID / FILE) == SHA256
    finally:
        for n in (g, h2, h1):
            n.kill()


def test_a_copy_gone_bad_is_refused_chunk_by_chunk_and_fetched_elsewhere(holders, tmp_path_factory):
    """b's copy rots after b made its manifest (same size and mtime: nothing on b notices); every chunk
    b serves fails verification, so the whole file comes from a, and what lands is exact."""
    a, b, b_dir = holders
    bad = b_dir / MODEL_ID / FILE
    wait_until("b's manifest", lambda: (b_dir / MODEL_ID / f".{FILE}.manifest.json").exists())
    st = os.stat(bad)
    with open(bad, "r+b") as f:
        for off in range(0, SIZE, CHUNK):
            f.seek(off + 123)
            byte = f.read(1)
            f.seek(off + 123)
            f.write(bytes([byte[0] ^ 0x40]))
    os.utime(bad, ns=(st.st_atime_ns, st.st_mtime_ns))
    x, x_dir = lacking_node(holders, tmp_path_factory, "x-models")
    try:
        wait_members([x], [a, b, x])
        assert http("POST", f"{x.url}/downloads", {"model": MODEL_ID})[0] == 202
        done = wait_until("x's download", lambda: finished(x))
        assert done["refused_chunks"] >= 1, done
        assert done["sources"].get(f"peer {b.id}", 0) == 0, done
        assert done["sources"][f"peer {a.id}"] == SIZE, done
        assert sha256(x_dir / MODEL_ID / FILE) == SHA256
    finally:
        x.kill()


def test_a_stage_still_downloading_is_shown_and_waited_for(tmp_path_factory):
    """The holder sends at 8 MB/s, so the lacking node's stage downloads for seconds: its status in /state
    is `downloading` with growing byte counts, the driver waits for it (no timeout), then the pipeline
    serves."""
    h = ShoalNode("--no-auto-instance", "--upload-limit", "8", key="transfer-waiting")
    d = tmp_path_factory.mktemp("s-models")
    s = ShoalNode("--no-auto-instance", "--model", str(gemma_file()), "--peer", h.cluster_addr,
                  key="transfer-waiting", models_dir=d)
    try:
        wait_members([h, s], [h, s])
        status, body = http("POST", f"{h.url}/instance",
                            {"model": MODEL_ID, "nodes": [h.id, s.id], "layers": [20, 10]})
        assert status == 201, body
        iid = body["id"]

        def stage_of_s():
            inst = next(i for i in state(h)["cluster"]["instances"] if i["id"] == iid)
            return inst["status"], inst["stage_status"][1]

        seen = []

        def downloading_progress():
            status, st = stage_of_s()
            assert status != "failed", st
            if st["state"] == "downloading" and 0 < st["done"] < st["needed"]:
                seen.append(st["done"])
            return len(set(seen)) >= 2

        wait_until("s's stage to show its download progressing", downloading_progress, timeout=120)
        assert stage_of_s()[1]["needed"] < SIZE
        wait_until("the instance to be ready", lambda: stage_of_s()[0] == "ready", timeout=120)
        text, _, _ = greedy(h, PROMPTS[0])
        assert text
    finally:
        s.kill()
        h.kill()


def test_a_hub_model_comes_from_a_peer_and_the_hub_which_takes_over_when_the_peer_dies(tmp_path):
    """A hub model (`org/repo:TAG`) on a peer: the fetching node reads chunks from the peer and, with ranged
    reads checked against the same manifest, from the hub; when the peer dies the hub serves the rest."""
    from test_store import FakeHub

    root = tmp_path / "hub"
    repo = root / "org" / "SmolLM2-GGUF"
    repo.mkdir(parents=True)
    (repo / "SmolLM2-135M-Instruct-Q4_K_M.gguf").symlink_to(model_file())
    model = "org/SmolLM2-GGUF:Q4_K_M"
    fast = FakeHub(root)
    slow = FakeHub(root, "--rate", "12000000")

    def env(hub, name):
        e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        e["HF_HOME"] = str(tmp_path / f"hf-{name}")
        e["HF_ENDPOINT"] = hub.url
        return e

    holder = ShoalNode("--no-auto-instance", "--upload-limit", "12", "--model", model, key="transfer-hub",
                       models_dir=tmp_path / "holder-models", env=env(fast, "holder"))
    d = tmp_path / "fetcher-models"
    fetcher = ShoalNode("--no-auto-instance", "--model", str(gemma_file()), "--peer", holder.cluster_addr,
                        key="transfer-hub", models_dir=d, env=env(slow, "fetcher"))
    try:
        wait_members([holder, fetcher], [holder, fetcher])
        assert http("POST", f"{fetcher.url}/downloads", {"model": model})[0] == 202

        both = wait_until("the peer and the hub to serve a quarter",
                          lambda: running_past(fetcher, 0.25, model, sources=2))
        assert any("127.0.0.1" in name for name in both["sources"]), both
        holder.kill()
        done = wait_until("the download after the peer died", lambda: finished(fetcher, model), timeout=120)
        by_hub = sum(v for name, v in done["sources"].items() if "127.0.0.1" in name)
        assert by_hub > SIZE // 4 and done["sources"][f"peer {holder.id}"] > 0, json.dumps(done)
        files = [p for p in (d / "org--SmolLM2-GGUF--Q4_K_M").iterdir() if p.suffix == ".gguf"]
        assert len(files) == 1 and sha256(files[0]) == SHA256, files
        assert len(slow.content_gets()) >= 2, "the hub served ranged chunk reads"
        # The model lists under its hub id, complete, from the hub (its file came from a peer and the hub).
        listing = subprocess.run([str(_binary()), "models", "--models-dir", str(d)],
                                 capture_output=True, text=True, timeout=30)
        line = next(l for l in listing.stdout.splitlines() if "SmolLM2" in l)
        assert line.split()[0] == model and "complete" in line and "hub" in line, listing.stdout
    finally:
        fetcher.kill()
        holder.kill()
        fast.stop()
        slow.stop()
