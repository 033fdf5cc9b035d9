"""Every mixture-of-experts family as a 2-node pipeline of real `shoal serve` processes (issue 29): the
synthetic fixtures of crates/shoal-model/tests/fixtures/synth (qwen3moe, qwen2moe, gpt-oss in MXFP4 with
sinks and sliding windows, glm4moe, and deepseek2's multi-head latent attention in its three layouts), each
placed on one node, then split over two — the second node holding none of them, so it fetches its stage
from the first — with f32 activations on the wire. The split gives one node's greedy tokens (one node's
tokens are llama.cpp's: crates/shoal-model/tests/model/synthetic.rs checks them against the fixture's
recorded run)."""

import json
import shutil
import tempfile
from pathlib import Path

import openai
import pytest

from conftest import REPO, ShoalNode, models_dir_with
from test_cluster import place, remove, state, wait_members, wait_until

SYNTH = REPO / "crates/shoal-model/tests/fixtures/synth"
MANIFEST = json.loads((SYNTH / "manifest.json").read_text())
MOE = [f for f in MANIFEST["fixtures"] if f.get("experts")]
TOKENS = 8


@pytest.fixture(scope="module")
def pair():
    """Node a with every MoE fixture in its models dir; node b with none of them."""
    models = models_dir_with(MOE, "shoal-moe-models-")
    other = Path(tempfile.mkdtemp(prefix="shoal-moe-empty-"))
    # Each node is told a model of its own to serve, so that neither goes for the default one.
    first = str(models / MOE[0]["name"] / MOE[0]["file"])
    a = ShoalNode("--no-auto-instance", "--wire-dtype", "f32", "--model", first, models_dir=models)
    b = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr, "--model", str(SYNTH / "llama-s-f16.gguf"),
                  models_dir=other)
    try:
        wait_members([a, b], [a, b])
        yield a, b
    finally:
        a.kill()
        b.kill()
        shutil.rmtree(models, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)


def greedy_ids(node: ShoalNode, fixture: dict) -> "list[str]":
    """The fixture's prompt (token ids), completed greedily: each generated token's text."""
    def go():
        try:
            return openai.OpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0, timeout=120) \
                .completions.create(model=fixture["name"], prompt=fixture["prompt"], max_tokens=TOKENS,
                                    temperature=0, logprobs=0, extra_body={"ignore_eos": True})
        except openai.NotFoundError:
            return None

    r = wait_until(f"{fixture['name']} to be served", go)
    return r.choices[0].logprobs.tokens


@pytest.mark.parametrize("fixture", MOE, ids=[f["name"] for f in MOE])
def test_a_two_node_split_gives_one_nodes_tokens(pair, fixture):
    a, b = pair
    n = fixture["dims"]["n_layer"]
    outputs = {}
    for stages in ([(a, n)], [(a, 1), (b, n - 1)]):
        iid = place(a, stages, fixture["name"])
        inst = next(i for i in state(a)["cluster"]["instances"] if i["id"] == iid)
        assert [s["node"] for s in inst["stages"]] == [node.id for node, _ in stages]
        outputs[len(stages)] = greedy_ids(a, fixture)
        remove(a, iid)
    assert len(outputs[1]) == TOKENS
    assert outputs[2] == outputs[1], f"{fixture['name']}: the 2-node split differs from one node"
    # b held none of it: it fetched the model from a to host its stage, and has it whole now.
    fetched = b.models_dir / fixture["name"] / fixture["file"]
    assert fetched.read_bytes() == (SYNTH / fixture["file"]).read_bytes()
