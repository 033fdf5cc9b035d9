"""Pytest plugin (`-p llama_adapter`) that points llama.cpp's server test suite at a real `shoal serve`.

The suite drives llama-server through `utils.ServerProcess`: a test sets fields that become llama-server's
command-line flags, calls `start()`, then sends requests to `make_url(path)`. The adapter replaces only
that plumbing, never a test's requests or assertions:
- `ServerProcess.start` reaches a shoal node (the default test model; one node per API key and seed,
  since `--api-key` and `--seed` are the flags both servers share: the suite starts every server with
  `--seed 42`, so its sampled requests without a seed repeat, as they do on llama-server) instead of launching llama-server, and names the
  served model as shoal does (`model_alias` = shoal's catalog id, llama-server's `--alias` is its own flag);
  `stop` leaves the shared node running; `ServerPreset.load_all` (llama-server's model downloads) does
  nothing.
- `make_url` sends llama-server's unprefixed aliases of OpenAI routes (`/chat/completions`, `/models`)
  to the `/v1/...` routes OpenAI defines.
- a request's model name that shoal does not serve (`test`, `gpt-3.5-turbo-instruct`, `davinci-002`, ...)
  is replaced by the served one, in `make_request` / `make_stream_request` and in `openai.OpenAI` as the
  tests import it (which also gets `/v1` appended to a base URL without it): llama-server answers any
  name with its one model, shoal (as OpenAI and Anthropic) answers 404 `model_not_found`. Nothing else
  of a request is touched.

Tests that exercise llama-server-only features are skipped and shoal's known defects marked, by the
explicit lists in `llama_expectations.py`; the terminal summary prints the counts and both lists' use.
"""

import sys
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
import expectations  # noqa: E402
import llama_expectations  # noqa: E402
import shoal_node  # noqa: E402
import suite  # noqa: E402

SUITE = suite.llama_server_tests()
sys.path.insert(0, str(SUITE))
import utils  # noqa: E402  (llama.cpp's tests/utils.py)

# llama-server's aliases of OpenAI's routes, and where OpenAI (and shoal) serve them. Its `/completion`,
# `/completions` and `/embeddings` are its native routes, with shapes of their own: they stay as they are.
OPENAI_ALIASES = {"/chat/completions": "/v1/chat/completions", "/models": "/v1/models"}


def _start(self, timeout_seconds: int = utils.DEFAULT_HTTP_TIMEOUT) -> None:
    flags = ["--api-key", self.api_key] if self.api_key else []
    if self.seed is not None and self.seed >= 0:  # llama-server's -1: a random seed, shoal's default
        flags += ["--seed", str(self.seed)]
    node = shoal_node.node(*flags)
    host, _, port = node.url.removeprefix("http://").rpartition(":")
    self.server_host, self.server_port = host, int(port)
    self.model_alias = shoal_node.MODEL_ID
    self.ready = True
    utils.server_instances.add(self)


def _stop(self) -> None:
    utils.server_instances.discard(self)


_make_url = utils.ServerProcess.make_url


def _make_url_v1(self, path: str, host: "str | None" = None) -> str:
    return _make_url(self, OPENAI_ALIASES.get(path, path), host)


def _served_model(data):
    """`data` with a model name shoal does not serve replaced by the served one (see the overview)."""
    if isinstance(data, dict) and data.get("model") not in (None, shoal_node.MODEL_ID):
        return {**data, "model": shoal_node.MODEL_ID}
    return data


_make_request, _make_stream_request = utils.ServerProcess.make_request, utils.ServerProcess.make_stream_request


def _make_request_served(self, method, path, data=None, *args, **kwargs):
    return _make_request(self, method, path, _served_model(data), *args, **kwargs)


def _make_stream_request_served(self, method, path, data=None, *args, **kwargs):
    return _make_stream_request(self, method, path, _served_model(data), *args, **kwargs)


utils.ServerProcess.start = _start
utils.ServerProcess.make_request = _make_request_served
utils.ServerProcess.make_stream_request = _make_stream_request_served
utils.ServerProcess.stop = _stop
utils.ServerProcess.make_url = _make_url_v1
utils.ServerPreset.load_all = staticmethod(lambda: None)


class ShoalOpenAI(openai.OpenAI):
    """`openai.OpenAI` as llama-server's tests use it, aimed at shoal (see the module's overview)."""

    def __init__(self, *args, base_url=None, **kwargs):
        if base_url is not None and not str(base_url).rstrip("/").endswith("/v1"):
            base_url = str(base_url).rstrip("/") + "/v1"
        super().__init__(*args, base_url=base_url, **kwargs)

    def _build_request(self, options, *args, **kwargs):
        options.json_data = _served_model(options.json_data)
        return super()._build_request(options, *args, **kwargs)


openai.OpenAI = ShoalOpenAI


def pytest_configure(config):
    config.pluginmanager.register(expectations.Expectations(
        "llama.cpp server tests against shoal", llama_expectations.SKIPS, llama_expectations.KNOWN_DEFECTS,
        skip_prefix="llama-server only: ",
        extra_skip=lambda item: llama_expectations.SLOW if item.get_closest_marker("slow") else None))
