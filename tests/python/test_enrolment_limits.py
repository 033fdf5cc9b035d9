"""`POST /cluster/enroll` through the real binary (issue 26, item 4): open to strangers even with API keys, so
bounded — a 2 MiB enrolment is a 413 and leaves nothing in the log (ten of them once grew it by 21 MB), a
newline in `node` forges no log line and the invite never appears in the log, and failed tries from one
address are limited: after 5, a 429 with Retry-After; 2,000 concurrent guesses are not all answered as
guesses. Loopback only; every test is bounded in time."""

import concurrent.futures
import http.client
import json
import queue
import socket
import time
from urllib.parse import urlsplit

import pytest

from conftest import ShoalNode

BOUND_S = 120
pytestmark = pytest.mark.usefixtures("bounded")
TWO_MIB = 2 << 20
PROOF = "00" * 32


@pytest.fixture
def node():
    n = ShoalNode("--no-auto-instance", key=None)
    try:
        yield n
    finally:
        n.kill()


def hostport(node: ShoalNode):
    u = urlsplit(node.url)
    return u.hostname, u.port


def enroll(node: ShoalNode, body: bytes, timeout: float = 30):
    """POSTs `body` to /cluster/enroll: (status, headers, text)."""
    conn = http.client.HTTPConnection(*hostport(node), timeout=timeout)
    try:
        conn.request("POST", "/cluster/enroll", body=body, headers={"content-type": "application/json"})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode(errors="replace")
    finally:
        conn.close()


def guess(node: ShoalNode, node_id: str = "12D3KooWstranger", invite: str = "a1b2c3d4e5f6"):
    return enroll(node, json.dumps({"invite": invite, "node": node_id, "proof": PROOF}).encode())


def new_log(node: ShoalNode, settle_s: float = 0.5) -> str:
    """What the node wrote to stderr since the last call (after `settle_s` of quiet)."""
    out = []
    while True:
        try:
            line = node.err.get(timeout=settle_s)
        except queue.Empty:
            break
        if line is None:
            break
        out.append(line)
    node.log.extend(out)
    return "".join(out)


def test_a_2_mib_enrolment_is_413_and_leaves_no_trace_in_the_log(node):
    new_log(node, 1.0)
    forged = ("A\n2030-01-01T00:00:00.000000Z  INFO shoal_cluster: FORGED-BY-INVITE ") * (TWO_MIB // 60)
    body = json.dumps({"invite": forged, "node": "n", "proof": PROOF}).encode()[:TWO_MIB]
    # Declared: answered from the headers, before the body is read.
    with socket.create_connection(hostport(node), timeout=10) as s:
        s.sendall(b"POST /cluster/enroll HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\n\r\n" % len(body))
        answer = s.recv(4096).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 413 "), answer
    assert '"code":"request_too_large"' in answer, answer
    # Ten whole 2 MiB enrolments, as the review sent them: each refused (the node may close the
    # connection while the rest of the body is still on its way).
    started = time.monotonic()
    for _ in range(10):
        try:
            status, _, _ = enroll(node, body)
            assert status == 413
        except (ConnectionResetError, BrokenPipeError):
            pass
    assert time.monotonic() - started < 30
    grown = new_log(node)
    assert len(grown) < 2048, f"the log grew by {len(grown)} bytes:\n{grown[:2000]}"
    assert "FORGED-BY-INVITE" not in grown


def test_a_newline_in_node_forges_no_log_line_and_the_invite_is_never_logged(node):
    new_log(node, 1.0)
    forged = "12D3KooWfake\n2030-01-01T00:00:00.000000Z  INFO shoal_cluster: FORGED-LINE"
    status, _, text = guess(node, node_id=forged)
    assert status == 400 and json.loads(text)["error"]["param"] == "node", text
    assert "FORGED-LINE" not in text
    # A well-formed guess of an invite this node never made: refused, and logged without the invite.
    status, _, text = guess(node, node_id="12D3KooWhonestguess", invite="c0ffee123456")
    assert status == 403, text
    grown = new_log(node)
    assert "FORGED-LINE" not in grown, grown
    refused = [line for line in grown.splitlines() if "invite refused" in line]
    assert len(refused) == 1 and "12D3KooWhonestguess" in refused[0], grown
    assert "c0ffee123456" not in grown, "the invite is never logged"


def test_repeated_failed_enrolments_get_429_with_retry_after(node):
    for i in range(5):
        status, _, text = guess(node)
        assert status == 403, f"try {i}: {text}"
    status, headers, text = guess(node)
    assert status == 429, text
    assert json.loads(text)["error"]["code"] == "rate_limit_exceeded"
    retry = {k.lower(): v for k, v in headers.items()}["retry-after"]
    assert 1 <= int(retry) <= 60, retry
    # Stays refused, whatever is sent, until the window passes.
    assert guess(node, node_id="12D3KooWother")[0] == 429


def test_2000_concurrent_guesses_are_not_all_answered(node):
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        statuses = list(pool.map(lambda _: guess(node)[0], range(2000)))
    answered = statuses.count(403)
    assert answered <= 5, f"{answered} guesses were answered"
    assert statuses.count(429) == 2000 - answered, sorted(set(statuses))
