"""Limits with clear errors, through the real binary (issue 30, "Soak and limits"): a token budget that can
never be held is refused at once with a 400 in each API's own shape — streamed or not — and the queue bound
answers 503 (Anthropic: 529) with Retry-After; after each refusal the node serves the next request.

One node on the test model (SmolLM2-135M, 8,192-token context) with a 32 MiB KV budget (1,456 tokens of
it: a budget smaller than the context), one sequence at a time and a queue depth of 2, so every limit is
reached with small requests:
- `max_tokens` 10^9: beyond the context — vLLM's and OpenAI's `context_length_exceeded` on the OpenAI
  routes, Anthropic's "input length and `max_tokens` exceed context limit" on `/v1/messages`; Ollama takes
  `num_predict` as a cap (as Ollama does) and answers;
- `max_tokens` 5,000: within the context, beyond the KV budget (`kv_budget_exceeded`);
- `n` = 2 × `max_tokens` 1,000: each choice fits, the two never do together (`kv_budget_exceeded` on `n`);
- the queue: one long stream runs, 4 more requests wait (the engine's wait list and its intake, 2 each),
  and the next ones are refused until they drain.
And on a node of default limits, 200 streams opened at once and dropped together leave no descriptor behind.
"""

import json
import os
import re
import socket
import threading
import time

import httpx
import pytest

from conftest import MODEL_ID, ShoalNode

BOUND_S = 240
pytestmark = pytest.mark.usefixtures("bounded")
HUGE = 1_000_000_000
CONTEXT = 8192
QUEUE_DEPTH = 2

HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def node():
    n = ShoalNode(
        "--kv-budget-mib", "32", "--max-running", "1", "--queue-depth", str(QUEUE_DEPTH),
        key="python-tests-limits", threads=2,
    )
    try:
        yield n
    finally:
        n.kill()


def post(node, path, body, timeout=60.0):
    return httpx.post(f"{node.url}{path}", json=body, timeout=timeout)


def serves(node):
    """The node answers a short chat completion and `/health` (it kept serving)."""
    assert httpx.get(f"{node.url}/health", timeout=10).status_code == 200
    r = post(node, "/v1/chat/completions", {"model": MODEL_ID, "messages": HELLO, "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] != "" or r.json()["usage"]["completion_tokens"] == 3


def openai_error(r, status, param, code):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert err["code"] == code
    return err["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_max_tokens_beyond_the_context_is_vllms_400(node, stream):
    r = post(node, "/v1/chat/completions",
             {"model": MODEL_ID, "messages": HELLO, "max_tokens": HUGE, "stream": stream})
    msg = openai_error(r, 400, "max_tokens", "context_length_exceeded")
    m = re.fullmatch(
        r"This model's maximum context length is (\d+) tokens\. However, you requested (\d+) tokens "
        r"\((\d+) in the messages, (\d+) in the completion\)\. Please reduce the length of the messages or "
        r"completion\.", msg)
    assert m, msg
    context, total, prompt, completion = map(int, m.groups())
    assert (context, completion) == (CONTEXT, HUGE)
    assert total == prompt + completion and 5 < prompt < 100
    serves(node)


def test_the_field_sent_is_the_one_named(node):
    r = post(node, "/v1/chat/completions",
             {"model": MODEL_ID, "messages": HELLO, "max_completion_tokens": HUGE})
    openai_error(r, 400, "max_completion_tokens", "context_length_exceeded")
    r = post(node, "/v1/responses", {"model": MODEL_ID, "input": "Say hello.", "max_output_tokens": HUGE})
    openai_error(r, 400, "max_output_tokens", "context_length_exceeded")
    r = post(node, "/v1/completions", {"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": HUGE,
                                       "stream": True})
    msg = openai_error(r, 400, "max_tokens", "context_length_exceeded")
    assert "in the completion" in msg
    serves(node)


def test_max_tokens_beyond_the_kv_budget_is_refused_naming_it(node):
    r = post(node, "/v1/chat/completions", {"model": MODEL_ID, "messages": HELLO, "max_tokens": 5000})
    msg = openai_error(r, 400, "max_tokens", "kv_budget_exceeded")
    m = re.match(r"This instance's KV budget holds (\d+) tokens, fewer than the model's context\.", msg)
    assert m, msg
    # 32 MiB of SmolLM2's f16 KV (30 layers x 2 x 3 heads x 64 x 2 bytes = 22.5 KiB a token).
    assert int(m.group(1)) == (32 << 20) // (30 * 2 * 3 * 64 * 2)
    serves(node)


def test_choices_that_never_fit_together_are_refused_on_n_and_those_that_fit_run(node):
    r = post(node, "/v1/chat/completions", {"model": MODEL_ID, "messages": HELLO, "max_tokens": 1000, "n": 2})
    msg = openai_error(r, 400, "n", "kv_budget_exceeded")
    assert re.match(r"2 choices of \d+ prompt \+ 1000 max_tokens need \d+ tokens of KV at once, more than "
                    r"this instance's KV budget holds \(1456 tokens\): lower n or max_tokens$", msg), msg
    # The same with one choice fits, and so do two small ones.
    r = post(node, "/v1/chat/completions", {"model": MODEL_ID, "messages": HELLO, "max_tokens": 4, "n": 2})
    assert r.status_code == 200, r.text
    assert [c["index"] for c in r.json()["choices"]] == [0, 1]
    serves(node)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_refuses_in_its_own_words(node, stream):
    r = post(node, "/v1/messages", {"model": MODEL_ID, "messages": HELLO, "max_tokens": HUGE, "stream": stream})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert re.fullmatch(
        r"input length and `max_tokens` exceed context limit: \d+ \+ 1000000000 > 8192, decrease input length "
        r"or `max_tokens` and try again", body["error"]["message"]), body
    r = post(node, "/v1/messages", {"model": MODEL_ID, "messages": HELLO, "max_tokens": 5000})
    assert r.status_code == 400, r.text
    assert re.search(r": \d+ \+ 5000 > 1456, ", r.json()["error"]["message"]), r.text
    serves(node)


def test_ollama_takes_num_predict_as_a_cap(node):
    # Ollama never refuses num_predict: the answer starts (and would end at the KV budget's last token).
    body = {"model": MODEL_ID, "messages": HELLO, "stream": True, "options": {"num_predict": HUGE}}
    with httpx.stream("POST", f"{node.url}/api/chat", json=body, timeout=60) as r:
        assert r.status_code == 200
        first = json.loads(next(r.iter_lines()))
        assert first["done"] is False and first["message"]["role"] == "assistant"
    serves(node)


def test_the_queue_bound_refuses_in_each_shape_with_retry_after_and_drains(node):
    # One long stream holds the only sequence slot.
    long = {"model": MODEL_ID, "messages": HELLO, "max_tokens": 1000, "ignore_eos": True, "stream": True}
    client = httpx.Client(timeout=120)
    with client.stream("POST", f"{node.url}/v1/chat/completions", json=long) as running:
        assert running.status_code == 200
        lines = running.iter_lines()
        assert next(line for line in lines if line.startswith("data: ")).startswith("data: {")
        # Waiting requests: each sent once the one before is queued (it has not answered within 0.5 s).
        results = {}

        def send(i):
            results[i] = post(node, "/v1/chat/completions",
                              {"model": MODEL_ID, "messages": HELLO, "max_tokens": 2}, timeout=180)

        waiting = []
        for i in range(2 * QUEUE_DEPTH):
            t = threading.Thread(target=send, args=(i,))
            t.start()
            waiting.append(t)
            time.sleep(0.5)
            assert i not in results, f"request {i} was answered while the slot was held: {results[i].text}"
        # Past the bound: refused at once, in each API's shape.
        t0 = time.monotonic()
        r = post(node, "/v1/chat/completions", {"model": MODEL_ID, "messages": HELLO, "max_tokens": 2})
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "overloaded"
        r = post(node, "/v1/messages", {"model": MODEL_ID, "messages": HELLO, "max_tokens": 2})
        assert r.status_code == 529, r.text
        assert r.json()["error"]["type"] == "overloaded_error" and r.headers["retry-after"] == "1"
        r = post(node, "/api/chat", {"model": MODEL_ID, "messages": HELLO, "stream": False,
                                     "options": {"num_predict": 2}})
        assert r.status_code == 503, r.text
        assert set(r.json()) == {"error"} and "overloaded" in r.json()["error"]
        assert time.monotonic() - t0 < 10
        assert httpx.get(f"{node.url}/health", timeout=10).status_code == 200
    # The long stream closed: the waiting requests run, and the node serves new ones.
    for t in waiting:
        t.join(timeout=120)
    assert sorted(results) == list(range(2 * QUEUE_DEPTH))
    assert [results[i].status_code for i in sorted(results)] == [200] * (2 * QUEUE_DEPTH)
    serves(node)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_streams_opened_and_dropped_at_once_leave_no_descriptor_behind():
    # 200 streams at once on a node of default limits, dropped together as soon as each has its answer's
    # headers: the node's descriptors come back to what they were, and it serves the next request.
    n = ShoalNode(key="python-tests-burst", threads=2)
    try:
        serves(n)
        before = open_fds(n.proc.pid)
        host, port = n.url.removeprefix("http://").split(":")
        body = json.dumps({"model": MODEL_ID, "messages": HELLO, "max_tokens": 64, "ignore_eos": True,
                           "stream": True}).encode()
        request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                   f"content-length: {len(body)}\r\n\r\n").encode() + body
        socks = []
        for _ in range(200):
            s = socket.create_connection((host, int(port)), timeout=60)
            s.sendall(request)
            socks.append(s)
        statuses = [s.makefile("rb").readline().split()[1] for s in socks]
        assert set(statuses) <= {b"200", b"503"} and b"200" in statuses, set(statuses)
        assert open_fds(n.proc.pid) >= before + 100
        for s in socks:
            s.close()
        deadline = time.monotonic() + 30
        while open_fds(n.proc.pid) > before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert open_fds(n.proc.pid) <= before
        serves(n)
    finally:
        n.kill()
