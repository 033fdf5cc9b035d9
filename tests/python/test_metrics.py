"""`GET /metrics` scraped by a real Prometheus (Debian's `prometheus`) from a real 2-node cluster running one
2-stage instance, with the API key as the scrape's bearer credential, every second; after traffic, PromQL
queries through Prometheus' HTTP API return the series with sensible values. The alert rules and the Grafana
board of docs/monitoring/ name only metrics a live /metrics exports, the rules pass `promtool check rules`
and their unit tests `promtool test rules`, and Prometheus loads them. Every wait is bounded; Prometheus is
always killed."""

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import openai
import pytest

from conftest import MODEL_ID, REPO, ShoalNode

KEY = "metrics-test-key"
MONITORING = REPO / "docs" / "monitoring"
RULES = MONITORING / "shoal-alerts.yml"
BOARD = MONITORING / "shoal-grafana.json"
DEADLINE_S = 60
REQUESTS = 4


def wait_until(what: str, check, timeout: float = DEADLINE_S):
    """Polls `check()` until it returns something truthy; fails with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (urllib.error.URLError, ConnectionError) as e:
            last = e
        else:
            if last:
                return last
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout} s waiting for {what} (last: {last!r})", pytrace=False)


def http(method: str, url: str, body=None, key: "str | None" = KEY):
    data = None if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def state(node: ShoalNode) -> dict:
    status, body = http("GET", f"{node.url}/state")
    assert status == 200, body
    return json.loads(body)


def host_port(node: ShoalNode) -> str:
    return node.url.removeprefix("http://")


@pytest.fixture(scope="module")
def duo():
    """Nodes a and b (API key required) with one instance of the test model: layers 0-14 on a, which drives
    it, 15-29 on b."""
    a = ShoalNode("--no-auto-instance", "--api-key", KEY, key="metrics-tests")
    b = ShoalNode("--no-auto-instance", "--api-key", KEY, "--peer", a.cluster_addr, key="metrics-tests")
    try:
        for n in (a, b):
            wait_until(
                f"{n.id} to see both nodes and their link",
                lambda n=n: len(state(n)["cluster"]["nodes"]) == 2 and len(state(n)["cluster"]["links"]) == 1,
            )
        status, body = http(
            "POST", f"{a.url}/instance", {"model": MODEL_ID, "nodes": [a.id, b.id], "layers": [15, 15]}
        )
        assert status == 201, body
        iid = json.loads(body)["id"]

        def ready():
            inst = [i for i in state(a)["cluster"]["instances"] if i["id"] == iid]
            assert inst and inst[0]["status"] != "failed", inst
            return inst[0]["status"] == "ready"

        wait_until(f"instance {iid} to be ready", ready)
        yield a, b, iid
    finally:
        for n in (a, b):
            n.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prometheus(duo, tmp_path_factory):
    """A real Prometheus on 127.0.0.1 scraping both nodes every second with the API key, with the alert
    rules of docs/monitoring loaded; yields its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("`prometheus` is not installed: scripts/test installs Debian's prometheus package", pytrace=False)
    a, b, _ = duo
    d = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "shoal",
                "authorization": {"type": "Bearer", "credentials": KEY},
                "static_configs": [{"targets": [host_port(a), host_port(b)]}],
            }
        ],
    }
    # JSON is YAML.
    (d / "prometheus.yml").write_text(json.dumps(config))
    port = free_port()
    log = open(d / "prometheus.log", "w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={d / 'prometheus.yml'}",
            f"--storage.tsdb.path={d / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def is_ready():
            assert proc.poll() is None, (d / "prometheus.log").read_text()[-3000:]
            return http("GET", f"{url}/-/ready", key=None)[0] == 200

        wait_until("Prometheus to be ready", is_ready, timeout=30)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def sample(node: ShoalNode, series: str) -> "float | None":
    """The value of one series (`name{labels}` as /metrics writes it) in a node's /metrics, None if absent."""
    status, body = http("GET", f"{node.url}/metrics")
    assert status == 200, body
    for line in body.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def holds_what_the_driver_holds(a: ShoalNode, b: ShoalNode, iid: str) -> bool:
    """b's stage holds the KV a's engine holds (the same sequences and cached prefixes on every stage), as of
    the scrape: not the figure of its last batch."""
    share = sample(b, f'shoal_kv_share_used_tokens{{instance_id="{iid}",stage="1"}}')
    return share is not None and share == sample(a, f'shoal_engine_kv_tokens{{model="{MODEL_ID}"}}')


@pytest.fixture(scope="module")
def traffic(duo, prometheus):
    """REQUESTS chat requests while Prometheus scrapes, the last one sent to b (which relays it to a)."""
    a, b, iid = duo
    # The engine's warm-up request has come and gone through b's stage: it holds nothing.
    wait_until("b's stage to give the warm-up's KV back", lambda: holds_what_the_driver_holds(a, b, iid))
    assert sample(b, f'shoal_kv_share_used_tokens{{instance_id="{iid}",stage="1"}}') == 0
    # A first scrape of both before any request, so rates see the traffic arrive.
    eventually(prometheus, 'up{job="shoal"}', lambda r: len(r) == 2, "a first scrape of both nodes")
    for i in range(REQUESTS):
        node = b if i == REQUESTS - 1 else a
        client = openai.OpenAI(base_url=f"{node.url}/v1", api_key=KEY, max_retries=0, timeout=120)

        def ask():
            try:
                return client.chat.completions.create(
                    model=MODEL_ID,
                    messages=[{"role": "user", "content": f"Count to {i + 3}."}],
                    max_tokens=8,
                    temperature=0,
                )
            except openai.NotFoundError:  # the engine registers right after `ready`
                return None

        r = wait_until("a chat answer", ask)
        assert r.usage.completion_tokens > 0


def query(prom: str, promql: str) -> list:
    """The result vector of an instant query: [(labels, value), ...]."""
    status, body = http("GET", f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), key=None)
    assert status == 200, body
    data = json.loads(body)
    assert data["status"] == "success", data
    return [(r["metric"], float(r["value"][1])) for r in data["data"]["result"]]


def eventually(prom: str, promql: str, ok, what: str) -> list:
    """Polls `promql` until `ok(result)` holds (bounded)."""
    return wait_until(f"{what}: {promql}", lambda: (lambda r: r if ok(r) else None)(query(prom, promql)))


def test_prometheus_scrapes_both_nodes_and_promql_sees_the_traffic(duo, prometheus, traffic):
    a, b, iid = duo
    targets = {host_port(a): a, host_port(b): b}
    up = eventually(prometheus, 'up{job="shoal"}', lambda r: len(r) == 2 and all(v == 1 for _, v in r), "both up")
    assert {m["instance"] for m, _ in up} == set(targets)

    generated = eventually(
        prometheus, f'sum(shoal_generated_tokens_total{{model="{MODEL_ID}"}})', lambda r: r and r[0][1] > 0, "tokens"
    )
    assert generated[0][1] >= REQUESTS
    eventually(
        prometheus,
        f'sum(shoal_time_to_first_token_seconds_count{{model="{MODEL_ID}"}})',
        lambda r: r and r[0][1] >= REQUESTS,
        "a TTFT per request",
    )
    # Each request counted once, where the client sent it: b counts the one it relayed to a, a does not count
    # it again.
    chats = eventually(
        prometheus,
        'sum by (instance) (shoal_http_requests_total{api="openai", route="/v1/chat/completions", status="200"})',
        lambda r: sum(v for _, v in r) >= REQUESTS,
        "the chat requests counted",
    )
    assert {m["instance"]: v for m, v in chats} == {host_port(a): REQUESTS - 1, host_port(b): 1}, chats
    # The driver's TTFT p99 from the histogram's buckets (rate over what the scrapes saw).
    p99 = eventually(
        prometheus,
        f'histogram_quantile(0.99, sum by (le) (rate(shoal_time_to_first_token_seconds_bucket{{model="{MODEL_ID}"}}[1m])))',
        lambda r: r and r[0][1] == r[0][1] and r[0][1] > 0,  # not NaN
        "a TTFT p99",
    )
    assert 0 < p99[0][1] <= 120
    # The link both ways, its round trip measured.
    for me, peer in ((a, b), (b, a)):
        rtt = eventually(
            prometheus,
            f'shoal_link_rtt_seconds{{node="{me.id}", peer="{peer.id}"}}',
            lambda r: len(r) == 1,
            f"the link {me.id} -> {peer.id}",
        )
        assert 0 < rtt[0][1] < 1, rtt
        assert rtt[0][0]["instance"] == host_port(me), "each node exports its own links"
        assert rtt[0][0]["kind"] == "loopback"
    # b runs stage 1 for a: its step time, its KV share.
    steps = eventually(
        prometheus,
        f'shoal_stage_step_seconds_count{{instance="{host_port(b)}", instance_id="{iid}"}}',
        lambda r: r and r[0][1] > 0,
        "b's hosted stage step time",
    )
    assert steps[0][0]["stage"] == "1"
    # a, the driver, times each batch's wait for its tokens: the same batches as b's steps, each wait longer
    # than b's step in it (what is left is the hop there and back).
    def wait_and_step():
        series = [f"{name}_{part}" for name in ("shoal_pipeline_wait_seconds", "shoal_stage_step_seconds")
                  for part in ("count", "sum")]
        got = {s: query(prometheus, f'{s}{{instance_id="{iid}"}}') for s in series}
        if any(len(r) != 1 for r in got.values()):
            return None
        counts = got["shoal_pipeline_wait_seconds_count"][0][1], got["shoal_stage_step_seconds_count"][0][1]
        return counts[0] == counts[1] > 0 and got

    got = wait_until("a's wait for each batch b stepped", wait_and_step)
    assert got["shoal_pipeline_wait_seconds_count"][0][0]["instance"] == host_port(a)
    waited, stepped = got["shoal_pipeline_wait_seconds_sum"][0][1], got["shoal_stage_step_seconds_sum"][0][1]
    assert waited > stepped > 0, (waited, stepped)
    eventually(
        prometheus,
        f'shoal_kv_share_capacity_tokens{{instance="{host_port(b)}", instance_id="{iid}"}}',
        lambda r: r and r[0][1] > 0,
        "b's KV share",
    )
    eventually(
        prometheus,
        f'shoal_kv_share_used_tokens{{instance="{host_port(b)}", instance_id="{iid}", stage="1"}}',
        lambda r: len(r) == 1,
        "what b's stage holds of its share",
    )
    wait_until("b's stage to hold what a's engine holds", lambda: holds_what_the_driver_holds(a, b, iid))
    # The instance, ready, exported once: by its driver.
    ready = eventually(
        prometheus,
        f'shoal_instance_state{{instance_id="{iid}", state="ready"}}',
        lambda r: len(r) == 1 and r[0][1] == 1,
        "the instance ready",
    )
    assert ready[0][0]["instance"] == host_port(a)
    stages = query(prometheus, f'shoal_instance_stage_info{{instance_id="{iid}"}}')
    assert sorted((m["stage"], m["node"], m["start"], m["end"]) for m, _ in stages) == [
        ("0", a.id, "0", "15"),
        ("1", b.id, "15", "30"),
    ]
    # Both nodes' resources.
    for name in ("shoal_node_cpu_load_ratio", "shoal_node_memory_used_ratio"):
        r = eventually(prometheus, name, lambda r: len(r) == 2, f"{name} of both nodes")
        assert all(0 <= v <= 1 for _, v in r), r
    mem = query(prometheus, "shoal_node_memory_total_bytes")
    assert len(mem) == 2 and all(v > 0 for _, v in mem)
    members = query(prometheus, "shoal_cluster_nodes")
    assert sorted(v for _, v in members) == [2, 2]
    # The alert rules loaded and evaluated, none firing on a healthy cluster.
    status, body = http("GET", f"{prometheus}/api/v1/rules", key=None)
    rules = [r for g in json.loads(body)["data"]["groups"] for r in g["rules"]]
    assert len(rules) == 5 and all(r["health"] != "err" for r in rules), rules
    assert [r["name"] for r in rules if r["state"] == "firing"] == []


def metric_names(text: str) -> set:
    return set(re.findall(r"\bshoal_[a-z0-9_]+", text))


def exported_families(node: ShoalNode) -> set:
    """Every name a node's /metrics exports (histograms with their _bucket, _sum and _count)."""
    status, body = http("GET", f"{node.url}/metrics")
    assert status == 200, body
    names = set()
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def test_the_board_and_the_alert_rules_use_only_exported_metrics(duo, traffic):
    a, b, _ = duo
    exported = exported_families(a) | exported_families(b)
    board = BOARD.read_text()
    json.loads(board)  # valid JSON
    exprs = " ".join(t["expr"] for p in json.loads(board)["panels"] for t in p["targets"])
    used = {"board": metric_names(exprs), "alerts": metric_names(RULES.read_text())}
    assert len(used["board"]) >= 20 and len(used["alerts"]) >= 4, used
    for where, names in used.items():
        missing = sorted(names - exported)
        assert not missing, f"the {where} use metrics /metrics does not export: {missing}"


def test_metrics_need_the_api_key(duo):
    a, _, _ = duo
    assert http("GET", f"{a.url}/metrics", key=None)[0] == 401
    assert http("GET", f"{a.url}/metrics", key="wrong")[0] == 401


def test_alert_rules_pass_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("`promtool` is not installed: scripts/test installs Debian's prometheus package", pytrace=False)
    for args in (["check", "rules", RULES.name], ["test", "rules", "shoal-alerts.test.yml"]):
        r = subprocess.run([promtool, *args], cwd=MONITORING, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
        assert "SUCCESS" in r.stdout
