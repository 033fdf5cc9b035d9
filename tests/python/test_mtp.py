"""The model's own multi-token-prediction drafts through the real binary (`"speculative": "mtp"`, issue 32):
a node serving the synthetic glm4moe fixture (3 layers and one nextn block, random weights) with
`--speculative mtp` answers a greedy
completion asking for them with the tokens of the same request without speculation, its drafts verified
(/metrics); a node whose model has no nextn block (SmolLM2) refuses such a request with a 400 in the OpenAI
shape naming the field, and keeps serving."""

import json
import shutil

import pytest

from conftest import MODEL_ID, REPO, ShoalNode, models_dir_with
from test_cluster import wait_until
from test_draft_model import metric, post

SYNTH = REPO / "crates/shoal-model/tests/fixtures/synth"
MANIFEST = json.loads((SYNTH / "manifest.json").read_text())
GLM = next(f for f in MANIFEST["fixtures"] if f["name"] == "glm4moe-k-q4_k_m")


def complete(node: ShoalNode, model: str, prompt, speculative):
    # 48 tokens: random weights' drafts are rarely accepted, so the engine may price drafting out after
    # its first passes; it probes with a drafted token again 32 tokens later.
    body = {"model": model, "prompt": prompt, "max_tokens": 48, "temperature": 0, "ignore_eos": True,
            "logprobs": 0}
    if speculative is not None:
        body["speculative"] = speculative
    return post(node, "/v1/completions", body)


@pytest.fixture(scope="module")
def glm():
    models = models_dir_with([GLM], "shoal-mtp-models-")
    # `--speculative mtp` loads the block (a node started without it never holds it).
    n = ShoalNode("--model", str(models / GLM["name"] / GLM["file"]), "--speculative", "mtp", models_dir=models,
                  key="python-tests-mtp")
    try:
        wait_until("the glm4moe fixture to be served",
                   lambda: complete(n, GLM["name"], GLM["prompt"], None)[0] == 200, 120)
        yield n
    finally:
        n.kill()
        shutil.rmtree(models, ignore_errors=True)


def test_mtp_drafts_give_the_same_greedy_tokens_and_are_verified(glm):
    status, plain = complete(glm, GLM["name"], GLM["prompt"], "off")
    assert status == 200, plain
    before = metric(glm, "shoal_speculative_drafted_tokens_total", GLM["name"])
    status, drafted = complete(glm, GLM["name"], GLM["prompt"], {"method": "mtp", "max_draft": 4})
    assert status == 200, drafted
    tokens = lambda r: r["choices"][0]["logprobs"]["tokens"]
    assert tokens(drafted) == tokens(plain)
    assert len(tokens(plain)) == 48
    assert metric(glm, "shoal_speculative_drafted_tokens_total", GLM["name"]) > before


def test_a_model_without_a_nextn_block_refuses_mtp_and_keeps_serving():
    n = ShoalNode(key="python-tests-no-mtp")
    try:
        wait_until("the model to be served", lambda: complete(n, MODEL_ID, "a", None)[0] == 200, 120)
        status, err = complete(n, MODEL_ID, "Hello", "mtp")
        assert status == 400, err
        assert err["error"]["param"] == "speculative", err
        assert "multi-token-prediction" in err["error"]["message"], err
        assert complete(n, MODEL_ID, "Hello", "ngram")[0] == 200
    finally:
        n.kill()
