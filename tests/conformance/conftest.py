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
    # shoal-guide's tools/cut.rs reads an answer of the generic tool format (SmolLM2, Gemma) that ended at
    # its token cap as a cut call wherever `{"tool_calls": [` appears in it: it scans the whole text, where
    # parse.rs's `generic` takes a call only when the answer is that JSON object (fenced or not). So an
    # unforced answer of prose then a markdown JSON block comes back, not streamed, as a call (OpenAI
    # chat, Anthropic, Ollama alike) and its prose is lost: with an empty name when cut before the name
    # (llm: "Chain limit of 2 exceeded"), else with the arguments cut ("Expecting value"); streamed it is
    # text. Fix: the generic arm of `cut_calls` returns None unless the (unfenced) answer starts with `{`,
    # and a cut call that never got a name is no call unless one function is forced.
    **dict.fromkeys(("*test_llm_cli.py::test_functions_cut_off[[]*-cut_before_name]",
                     "*test_llm_cli.py::test_functions_cut_off[[]*-cut_in_call]"),
                    "an unforced answer cut by max_tokens after prose is read as a cut tool call when not streamed"),
}


@pytest.fixture(scope="session")
def shoal_url() -> str:
    return shoal_node.node().url


def pytest_configure(config):
    config.pluginmanager.register(expectations.Expectations("client libraries against shoal", {}, KNOWN_DEFECTS))
