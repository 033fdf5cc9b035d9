"""Web pages against a keyless node bound to loopback, in headless Chromium (issue 26, item 2).

A page of another origin — served by a second local HTTP server under a name that is not this machine's
(Chromium maps `evil.test` and `friend.test` to 127.0.0.1) — can neither read `/state` nor delete the model:
the preflight of its DELETE gets no consent, and the `text/plain` POST a browser sends without asking is
refused by the node (403) before any handler runs; the model is still there afterwards. A page of an origin
given with `--cors-origin` reads `/state` and gets its DELETE answered, and the node's own dashboard keeps
working. A name rebound to 127.0.0.1 (DNS rebinding) gets nothing but a 403. Every wait is bounded; the
browser always quits."""

import functools
import http.server
import json
import threading
import time
import urllib.request

import pytest

from conftest import MODEL_ID, ShoalNode
from test_dashboard import chromium
from test_store import smollm2_file

BOUND_S = 180
pytestmark = pytest.mark.usefixtures("bounded")

# What a page tries against the node at `node`: read /state, DELETE the model (a preflighted request), and
# a simple POST (no preflight: `no-cors`, text/plain) whose answer it cannot read but whose effect counts.
PAGE = """<!doctype html><meta charset="utf-8"><title>another origin</title><script>
async function attempt(node, model) {
  const out = {};
  try {
    const r = await fetch(node + "/state");
    out.read = "read " + r.status + " " + (await r.text()).slice(0, 60);
  } catch (e) { out.read = "blocked"; }
  try {
    const r = await fetch(node + "/api/delete", {method: "DELETE",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify({model})});
    out.delete = "answered " + r.status;
  } catch (e) { out.delete = "blocked"; }
  try {
    const r = await fetch(node + "/api/generate", {method: "POST", mode: "no-cors",
      headers: {"Content-Type": "text/plain"}, body: JSON.stringify({model, prompt: "hi", stream: false})});
    out.simple = "sent (" + r.type + ")";
  } catch (e) { out.simple = "blocked"; }
  return out;
}
</script>"""


@pytest.fixture
def pages(tmp_path):
    """A second local HTTP server (another port) serving PAGE; yields its port."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "page.html").write_text(PAGE)
    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def node(tmp_path, pages):
    """A keyless node on loopback whose own models dir holds SmolLM2 (a link), allowing one more origin."""
    models = tmp_path / "models"
    (models / MODEL_ID).mkdir(parents=True)
    (models / MODEL_ID / smollm2_file().name).symlink_to(smollm2_file())
    n = ShoalNode("--no-auto-instance", "--cors-origin", f"http://friend.test:{pages}",
                  "--log", "info,shoal_api::guard=debug", key=None, models_dir=models)
    try:
        yield n, models
    finally:
        n.kill()


@pytest.fixture
def browser():
    driver = chromium("--host-resolver-rules=MAP evil.test 127.0.0.1, MAP friend.test 127.0.0.1")
    driver.set_script_timeout(30)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def attempt_from(driver, page_url: str, node_url: str) -> dict:
    driver.get(page_url)
    return driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "attempt(arguments[0], arguments[1]).then(done, e => done({error: String(e)}));",
        node_url, MODEL_ID)


def tags(node) -> list:
    with urllib.request.urlopen(f"{node.url}/api/tags", timeout=10) as r:
        return [m["name"] for m in json.load(r)["models"]]


def refusals(node, timeout_s: float = 5.0) -> str:
    """The node's log lines about requests the origin policy refused (waiting up to `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [l for l in node.stderr_tail(400).splitlines() if "refused by the origin policy" in l]
        if lines or time.monotonic() > deadline:
            return "\n".join(lines)
        time.sleep(0.1)


def test_a_page_of_another_origin_neither_reads_nor_changes_the_node(browser, pages, node):
    n, models = node
    assert MODEL_ID in tags(n)
    got = attempt_from(browser, f"http://evil.test:{pages}/page.html", n.url)
    assert got.get("read") == "blocked", got
    assert got.get("delete") == "blocked", got
    assert got.get("simple") == "sent (opaque)", got
    # The browser sent the simple POST; the node refused it before it reached a handler.
    refused = refusals(n)
    assert "POST" in refused and "/api/generate" in refused, n.stderr_tail()
    # Nothing changed: the model is still listed and its folder still there.
    assert MODEL_ID in tags(n)
    assert (models / MODEL_ID / smollm2_file().name).exists()


def test_a_configured_origin_reads_and_the_own_dashboard_works(browser, pages, node):
    n, _ = node
    got = attempt_from(browser, f"http://friend.test:{pages}/page.html", n.url)
    assert got.get("read", "").startswith("read 200 "), got
    # Its DELETE passed the preflight and reached the handler, whose answer the page reads.
    assert got.get("delete", "").startswith("answered "), got
    # The node's own page (same origin) reads its API.
    browser.get(f"{n.url}/")
    own = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/state').then(r => done(r.status), e => done(String(e)));")
    assert own == 200


def test_a_rebound_name_gets_a_403(browser, node):
    n, _ = node
    port = n.url.rsplit(":", 1)[1]
    browser.get(f"http://evil.test:{port}/state")
    body = browser.find_element("tag name", "body").text
    assert "loopback" in body and '"code":"forbidden"' in body.replace(" ", ""), body
    with urllib.request.urlopen(f"{n.url}/state", timeout=10) as r:
        assert r.status == 200
