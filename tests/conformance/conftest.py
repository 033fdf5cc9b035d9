"""Fixtures of the client-library tests: one real `shoal serve` with the default test model for the
session, and the known shoal defects these tests hit (see expectations.py)."""

import os

import pytest

import expectations
import shoal_node

# litellm reads its model price list from the network at import unless told to use its bundled copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MODEL = shoal_node.MODEL_ID

# Tests that fail because of a defect of shoal's: pattern -> the defect. Fix it, then remove the entry.
KNOWN_DEFECTS: "dict[str, str]" = {
    "*test_langchain.py::test_bind_tools_forced[[]ChatOpenAI-default]":
        "a forced call whose schema leaves additionalProperties unset (as bind_tools writes it) is constrained to "
        "'any other keys too': the greedy model adds keys (even repeats one) and nested objects until max_tokens, "
        "so the call comes back cut (finish_reason length) and LangChain gets an invalid_tool_call; tool-argument "
        "schemas should close objects by default (additionalProperties: false, as xgrammar's strict mode)",
    "*test_litellm.py::test_forced_tool_call_cut_off[[]*-before_name]":
        "a forced call cut by max_tokens before the model has written the function's name comes back with name "
        "'' (OpenAI: tool_calls[0].function.name; Anthropic: the tool_use block's name; streamed, litellm then drops "
        "the call): the name of a forced call is known up front and should be sent whatever the cut",
}


@pytest.fixture(scope="session")
def shoal_url() -> str:
    return shoal_node.node().url


def pytest_configure(config):
    config.pluginmanager.register(expectations.Expectations("client libraries against shoal", {}, KNOWN_DEFECTS))
