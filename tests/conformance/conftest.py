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
KNOWN_DEFECTS: "dict[str, str]" = {}


@pytest.fixture(scope="session")
def shoal_url() -> str:
    return shoal_node.node().url


def pytest_configure(config):
    config.pluginmanager.register(expectations.Expectations("client libraries against shoal", {}, KNOWN_DEFECTS))
