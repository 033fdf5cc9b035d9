"""Logs: `--log` / `RUST_LOG` filters, `--log-format json`, a request id in every line about a request
(the client's `x-request-id`, else a new one, answered in the response and carried to the node that
serves a forwarded request), no colour codes when stderr is not a terminal, and errors as sentences."""

import json
import subprocess
import time

import httpx

from conftest import MODEL_ID, ShoalNode, _binary


def chat(url: str, request_id: "str | None" = None, **extra) -> httpx.Response:
    headers = {"x-request-id": request_id} if request_id else {}
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def lines_with(node: ShoalNode, needle: str, timeout_s: float = 10.0) -> "list[str]":
    """The node's stderr lines containing `needle`, waiting up to `timeout_s` for the first."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [line for line in node.stderr_tail(400).splitlines() if needle in line]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_json_lines_name_the_request_id_and_carry_no_colour_codes():
    node = ShoalNode("--log", "info,tower_http=debug", "--log-format", "json")
    try:
        r = chat(node.url, "py-logs-1")
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == "py-logs-1"
        # A timed-out request: the engine thread's warning names the request's id (a new one: the
        # client's id was not sane, so the response carries the one the node made).
        # ignore_eos: 200 tokens always outlast 50 ms (an answer that stops early once finished in time).
        r = chat(node.url, "not a sane id!", max_tokens=200, ignore_eos=True, timeout=0.05)
        assert r.status_code == 408, r.text
        made = r.headers["x-request-id"]
        assert made != "not a sane id!" and len(made) == 16
        warned = lines_with(node, '"level":"WARN"')
        records = [json.loads(line) for line in lines_with(node, made)]
        assert any(
            rec["level"] == "WARN"
            and rec["target"].startswith("shoal_engine")
            and rec["fields"]["message"] == "request failed: the request timed out after 50 ms"
            for rec in records
        ), warned
        given = [json.loads(line) for line in lines_with(node, "py-logs-1")]
        assert {rec["span"]["id"] for rec in given} == {"py-logs-1"}
        assert any(rec["target"] == "tower_http::trace::on_response" for rec in given), given
        log = node.stderr_tail(400)
        assert "\x1b[" not in log, "colour codes in a log that is not a terminal"
        for line in log.splitlines():
            if line.startswith("{"):
                json.loads(line)  # every log line is one JSON object
    finally:
        node.kill()


def test_a_forwarded_request_is_logged_with_its_id_on_the_node_that_serves_it(pipeline):
    a, b = pipeline  # b forwards requests to a, which drives the instance
    r = chat(b.url, "py-forwarded-7", max_tokens=300, timeout=0.05)
    assert r.status_code == 408, r.text
    assert r.headers["x-request-id"] == "py-forwarded-7"
    warned = lines_with(a, "request{id=py-forwarded-7}")
    assert any("WARN" in line and "request failed: the request timed out" in line for line in warned), (
        a.stderr_tail(40)
    )


def test_a_bad_filter_is_a_sentence_not_a_panic():
    for args, env, origin in (
        (["--log", "shoal_cluster=loud", "models"], {}, "--log"),
        (["models"], {"RUST_LOG": "shoal_engine=debug,=x=y"}, "RUST_LOG"),
    ):
        p = subprocess.run(
            [str(_binary()), *args], capture_output=True, text=True, timeout=30,
            env={"PATH": "/usr/bin:/bin", "RUST_BACKTRACE": "0", **env},
        )
        assert p.returncode != 0
        assert f"(from {origin}) is not valid: " in p.stderr, p.stderr
        assert "Write a level (error, warn, info, debug, trace)" in p.stderr
        assert "panicked" not in p.stderr


def test_shoal_log_still_works_and_the_flag_wins():
    # SHOAL_LOG=warn hides the INFO line `shoal serve` writes at start; --log info shows it again.
    quiet = ShoalNode(env=_env(SHOAL_LOG="warn"))
    loud = ShoalNode("--log", "info", env=_env(SHOAL_LOG="warn"))
    try:
        assert not lines_with(quiet, "INFO", timeout_s=1.0), quiet.stderr_tail()
        assert lines_with(loud, "INFO shoal::serve"), loud.stderr_tail()
    finally:
        quiet.kill()
        loud.kill()


def _env(**extra: str) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("RUST_LOG", "SHOAL_LOG")}
    env.update(extra)
    return env
