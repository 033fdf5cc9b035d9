"""The dashboard in a real browser (headless Chromium through selenium and Debian's chromedriver) against
a real 2-node cluster: the page lists both nodes and the link between them, a chat streams text into the
page, placing an instance from the page shows it loading then ready, and a killed node leaves the page.
Every wait is a bounded WebDriverWait; the browser always quits. With SHOAL_SCREENSHOTS=<dir> the tests
save screenshots there (docs/screenshots/ holds a couple)."""

import os
import urllib.request
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from conftest import MODEL_ID, ShoalNode
from test_cluster import http, place, wait_members

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 60


def chromium(*extra_args: str) -> webdriver.Chrome:
    """Headless Chromium through Debian's chromedriver, with `extra_args` on its command line."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).is_file():
            pytest.fail(f"{path} is missing: install Debian's chromium and chromium-driver", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", *extra_args):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture
def browser():
    driver = chromium("--window-size=1400,1500")
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def two_nodes():
    a = ShoalNode("--no-auto-instance", key="dashboard-tests")
    b = ShoalNode("--no-auto-instance", "--peer", a.cluster_addr, key="dashboard-tests")
    try:
        wait_members([a, b], [a, b])
        yield a, b
    finally:
        b.kill()
        a.kill()


def shot(driver, name: str) -> None:
    """Saves a screenshot under $SHOAL_SCREENSHOTS when it is set."""
    out = os.environ.get("SHOAL_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(out) / name))


def until(driver, what: str, check, timeout: float = WAIT_S):
    """Waits for `check(driver)` to return something truthy (a re-rendered element is looked up again)."""

    def safe(d):
        try:
            return check(d)
        except StaleElementReferenceException:
            return False

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(safe, message=f"waiting for {what}")


def read(driver, what: str, get):
    """`get(driver)` read in one go (the page redraws what the feed shows whenever it changes, so an element
    found earlier may be gone; a read that meets a redrawn element is tried again)."""
    return until(driver, what, lambda d: (get(d),))[0]


def node_cards(driver) -> set:
    return {e.get_attribute("data-node") for e in driver.find_elements(By.CSS_SELECTOR, ".node-card")}


def open_page(driver, node: ShoalNode) -> None:
    driver.get(f"{node.url}/")
    until(driver, "the live feed", lambda d: d.find_element(By.ID, "live").text == "live")


def test_root_answers_tools_as_ollama_does(two_nodes):
    a, _ = two_nodes
    with urllib.request.urlopen(f"{a.url}/", timeout=10) as r:
        assert r.status == 200
        assert r.read() == b"Ollama is running"


def test_the_page_lists_both_nodes_and_the_link_between_them(browser, two_nodes):
    a, b = two_nodes
    open_page(browser, a)
    until(browser, "both nodes' cards", lambda d: node_cards(d) == {a.id, b.id})
    this = read(browser, "this node's card",
                lambda d: d.find_element(By.CSS_SELECTOR, f'.node-card[data-node="{a.id}"]').text)
    assert "this node" in this and "cores" in this and "memory" in this
    gpus = until(browser, "this node's GPU by name and backend (lavapipe is installed here)", lambda d: (
        t := d.find_element(By.CSS_SELECTOR, f'.node-card[data-node="{a.id}"] .gpus').text) and "llvmpipe" in t and t)
    assert "vulkan" in gpus, gpus
    ends = until(browser, "the link", lambda d: [(e.get_attribute("data-a"), e.get_attribute("data-b"))
                                                for e in d.find_elements(By.CSS_SELECTOR, "#topology line.link")])
    assert len(ends) == 1 and set(ends[0]) == {a.id, b.id}, ends
    label = until(
        browser, "the link's measurements",
        lambda d: (t := d.find_element(By.CSS_SELECTOR, "#topology .link-label").text) and "rtt" in t and t,
    )
    assert "loopback" in label
    nodes = read(browser, "the graph's nodes", lambda d: {
        n.get_attribute("data-node") for n in d.find_elements(By.CSS_SELECTOR, "#topology g.node")})
    assert nodes == {a.id, b.id}
    shot(browser, "dashboard-cluster.png")


def test_placing_from_the_page_shows_the_instance_loading_then_ready(browser, two_nodes):
    a, b = two_nodes
    open_page(browser, a)
    until(browser, "the model list", lambda d: MODEL_ID in [o.get_attribute("value") for o in
                                                            Select(d.find_element(By.ID, "preview-model")).options])
    Select(browser.find_element(By.ID, "preview-model")).select_by_value(MODEL_ID)
    browser.find_element(By.ID, "preview-button").click()
    previews = until(browser, "placement previews", lambda d: d.find_elements(By.CSS_SELECTOR, ".preview"))
    first = previews[0].text
    assert "tok/s" in first, first
    reasons = previews[0].find_elements(By.CSS_SELECTOR, ".reasons li")
    assert len(reasons) == 2, "why each node is in or out"
    previews[0].find_element(By.CSS_SELECTOR, "button.place").click()
    card = f'.instance[data-model="{MODEL_ID}"]'
    until(browser, "the instance ready", lambda d: any(
        e.get_attribute("data-status") == "ready" for e in d.find_elements(By.CSS_SELECTOR, card)))
    history = read(browser, "the instance's history",
                   lambda d: d.find_element(By.CSS_SELECTOR, card).get_attribute("data-history").split())
    assert history[-1] == "ready" and "loading" in history, history
    # Both nodes run on this one machine: the planner prices a group of them as sharing its cores and
    # memory bus, so its best is no tensor-parallel group; one asked for by name is shown on its card
    # with the stage's other member.
    assert "tensor-parallel, weights" not in first and "the tensor-parallel group" in first, first
    status, body = http("POST", f"{a.url}/instance",
                        {"model": MODEL_ID, "nodes": [a.id, b.id], "tensor_parallel": True})
    assert status == 201, body
    group = until(browser, "the group's stage on its card", lambda d: next(
        (g for e in d.find_elements(By.CSS_SELECTOR, f"{card} .stage") if (g := e.get_attribute("data-group"))),
        None))
    assert group == b.id, group
    shot(browser, "dashboard-instance.png")


# Records, in the page, whether the prefill bar was shown and the first text it showed with an ETA.
PREFILL_OBSERVER = """
window.prefillSeen = { shown: false, eta: null };
const bar = document.getElementById('prefill'), text = document.getElementById('prefill-text');
new MutationObserver((records) => {
  if (records.some((r) => r.oldValue !== null)) window.prefillSeen.shown = true;  // 'hidden' removed
}).observe(bar, { attributes: true, attributeFilter: ['hidden'], attributeOldValue: true });
new MutationObserver(() => {
  if (window.prefillSeen.eta === null && text.textContent.includes('ETA')) window.prefillSeen.eta = text.textContent;
}).observe(text, { childList: true, characterData: true, subtree: true });
"""


# Every length the assistant's answer had in the page, recorded as the page changed it: a short answer can
# stream in well within one poll from here.
STREAM_OBSERVER = """
window.answerLengths = [];
new MutationObserver(() => {
  const msgs = document.querySelectorAll('.msg.assistant');
  const n = msgs.length ? msgs[msgs.length - 1].textContent.length : 0;
  if (n && window.answerLengths[window.answerLengths.length - 1] !== n) window.answerLengths.push(n);
}).observe(document.body, { childList: true, characterData: true, subtree: true });
"""


def test_a_chat_streams_into_the_page(browser, two_nodes):
    a, b = two_nodes
    place(a, [(a, 15), (b, 15)])  # through the pipeline: the page talks to a, the last stage samples on b
    open_page(browser, a)
    until(browser, "the chat's models", lambda d: MODEL_ID in [o.get_attribute("value") for o in
                                                               Select(d.find_element(By.ID, "chat-model")).options])
    Select(browser.find_element(By.ID, "chat-model")).select_by_value(MODEL_ID)
    box = browser.find_element(By.ID, "chat-input")
    box.send_keys("What is the capital of France? Answer in one sentence.")
    browser.execute_script(STREAM_OBSERVER)
    browser.find_element(By.ID, "chat-send").click()
    until(browser, "the answer's end", lambda d: d.find_element(By.CSS_SELECTOR, ".msg.assistant").text
          and d.find_element(By.ID, "chat-send").is_enabled(), timeout=120)
    lengths = browser.execute_script("return window.answerLengths")
    assert len(set(lengths)) >= 2, f"the text grew as it streamed: {lengths}"
    assert not browser.find_element(By.ID, "prefill").is_displayed(), "no progress bar once it answered"
    answer = browser.find_element(By.CSS_SELECTOR, ".msg.assistant")
    assert "error" not in answer.get_attribute("class"), answer.text
    assert answer.text.strip()
    stats = browser.find_element(By.ID, "chat-stats").text
    assert "generated tokens" in stats and "TTFT" in stats, stats
    until(browser, "the served tok/s on the driver's card",
          lambda d: any("tok/s" in e.text for e in d.find_elements(By.CSS_SELECTOR, ".node-card .tok-s")))
    shot(browser, "dashboard-chat.png")

    # A long prompt: the progress bar counts its prefill chunks (through both stages) before the answer.
    long = "Here are some numbers: " + ", ".join(str(i) for i in range(400)) + ". Which came last?"
    browser.execute_script("document.getElementById('chat-input').value = arguments[0];", long)
    # The page shows the bar only while the prompt is prefilled (under a second on a quiet machine), which a
    # poll from here can miss: an observer in the page records what it showed, as it showed it.
    browser.execute_script(PREFILL_OBSERVER)
    browser.find_element(By.ID, "chat-send").click()
    text = until(browser, "the prefill progress bar with an ETA",
                 lambda d: d.execute_script("return window.prefillSeen.shown && window.prefillSeen.eta"))
    done, total = (int(x) for x in text.split(" tokens")[0].removeprefix("prompt ").split(" / "))
    assert 0 < done < total and total > 1500, text
    shot(browser, "dashboard-prefill.png")
    # Its answer starts (the bar goes), and Stop ends it: the page closes the stream, the server cancels.
    until(browser, "the long prompt's answer",
          lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2
          and d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1].text.strip(), timeout=180)
    assert not browser.find_element(By.ID, "prefill").is_displayed()
    browser.find_element(By.ID, "chat-stop").click()
    until(browser, "the stop", lambda d: d.find_element(By.ID, "chat-send").is_enabled())
    stopped = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1]
    assert "(stopped)" in stopped.text and "error" not in stopped.get_attribute("class"), stopped.text
    until(browser, "the driver's engine to free the stopped request", lambda d: http("GET", f"{a.url}/state")[1]
          ["engines"][MODEL_ID]["active_sequences"] == 0)


def test_a_killed_node_leaves_the_page(browser, two_nodes):
    a, b = two_nodes
    open_page(browser, a)
    until(browser, "both nodes", lambda d: node_cards(d) == {a.id, b.id})
    b.kill()
    until(browser, "the killed node to leave", lambda d: node_cards(d) == {a.id})
    assert not read(browser, "the links", lambda d: d.find_elements(By.CSS_SELECTOR, "#topology line.link"))
    assert browser.find_element(By.ID, "live").text == "live", "the page stays connected to the node left"


def test_with_api_keys_the_page_asks_for_one(browser):
    node = ShoalNode("--no-auto-instance", "--api-key", "dashboard-key", key="dashboard-keys")
    try:
        browser.get(f"{node.url}/")
        until(browser, "the key prompt", lambda d: d.find_element(By.ID, "key-dialog").is_displayed())
        assert not node_cards(browser), "nothing shows without a key"
        box = browser.find_element(By.ID, "key-input")
        box.send_keys("wrong")
        browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
        until(browser, "the wrong key refused",
              lambda d: d.find_element(By.ID, "key-dialog").is_displayed()
              and "refused" in d.find_element(By.ID, "key-error").text)
        box.clear()
        box.send_keys("dashboard-key")
        browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
        until(browser, "the node's card", lambda d: node_cards(d) == {node.id})
        assert browser.execute_script("return sessionStorage.getItem('shoal-api-key')") == "dashboard-key"
    finally:
        node.kill()


def test_an_instance_that_speculates_shows_its_acceptance(browser):
    node = ShoalNode("--speculative", "ngram", key="dashboard-speculative")
    try:
        code = "".join(f"def f{i}(x):\n    y = x * 2\n    return y + {i}\n\n" for i in range(3))
        body = {"model": MODEL_ID, "prompt": code, "max_tokens": 48, "temperature": 0}
        until(browser, "an answer with drafts",
              lambda d: http("POST", f"{node.url}/v1/completions", body)[0] == 200, timeout=120)
        open_page(browser, node)
        text = until(browser, "the instance's acceptance", lambda d: next(
            (e.text for e in d.find_elements(By.CSS_SELECTOR, ".instance") if "% accepted" in e.text), None))
        rate = int(text.split("drafts ")[1].split("%")[0])
        per_pass = float(text.split("accepted, ")[1].split(" tokens a pass")[0])
        assert 0 < rate <= 100 and per_pass > 1.0, text
        shot(browser, "dashboard-speculation.png")
    finally:
        node.kill()
