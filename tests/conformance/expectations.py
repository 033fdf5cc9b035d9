"""What the conformance step does with its explicit lists, shared by both of its pytest runs: a test whose
id matches a skip pattern is skipped with its reason; one that matches a known-defect pattern runs as a
non-strict xfail ("known shoal defect, issue 28"); the outcomes are counted and printed, and written as
JSON to `$SHOAL_CONFORMANCE_SUMMARY` for `run.py`'s closing summary. Patterns are fnmatch patterns of
pytest ids (`[` written `[[]`). An `Expectations` is a pytest plugin: register it in `pytest_configure`;
it also stops the shoal nodes of the session at the end."""

import fnmatch
import json
import os
from pathlib import Path

import pytest

import shoal_node


class Expectations:
    def __init__(self, title: str, skips: "dict[str, str]", defects: "dict[str, str]", skip_prefix: str = "",
                 extra_skip=lambda item: None):
        """`extra_skip(item)`: a reason to skip a test that no pattern names, or None."""
        self.title, self.skips, self.defects, self.skip_prefix = title, skips, defects, skip_prefix
        self.extra_skip = extra_skip
        self.extra_skipped: "set[str]" = set()
        self.used: "set[str]" = set()
        self.defect_items: "dict[str, str]" = {}
        self.outcomes: "dict[str, str]" = {}

    def _match(self, nodeid: str, table: dict) -> "str | None":
        return next((p for p in table if fnmatch.fnmatchcase(nodeid, p)), None)

    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            self._mark(item)

    def _mark(self, item) -> None:
        extra_skip = self.extra_skip(item)
        pattern = self._match(item.nodeid, self.skips)
        if pattern is not None:
            self.used.add(pattern)
            item.add_marker(pytest.mark.skip(reason=f"{self.skip_prefix}{self.skips[pattern]}"))
        elif extra_skip is not None:
            self.extra_skipped.add(item.nodeid)
            item.add_marker(pytest.mark.skip(reason=f"{self.skip_prefix}{extra_skip}"))
        elif (pattern := self._match(item.nodeid, self.defects)) is not None:
            self.used.add(pattern)
            self.defect_items[item.nodeid] = self.defects[pattern]
            item.add_marker(pytest.mark.xfail(reason=f"known shoal defect, issue 28: {self.defects[pattern]}",
                                              strict=False))

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            if hasattr(report, "wasxfail"):
                self.outcomes[report.nodeid] = "xpassed" if report.passed else "xfailed"
            else:
                self.outcomes[report.nodeid] = report.outcome

    def pytest_unconfigure(self, config) -> None:
        shoal_node.stop_all()

    def pytest_terminal_summary(self, terminalreporter) -> None:
        counts = dict.fromkeys(("passed", "skipped", "failed", "xfailed", "xpassed"), 0)
        for nodeid, outcome in self.outcomes.items():
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome == "skipped" and nodeid in self.extra_skipped:
                counts["skipped_unlisted"] = counts.get("skipped_unlisted", 0) + 1
        by_file: "dict[str, dict[str, int]]" = {}  # the same counts per test file
        for nodeid, outcome in self.outcomes.items():
            file = by_file.setdefault(nodeid.split("::")[0], {})
            file[outcome] = file.get(outcome, 0) + 1
        write = terminalreporter.write_line
        write("")
        unlisted = counts.get("skipped_unlisted")
        unlisted = f" ({unlisted} of them marked slow upstream)" if unlisted else ""
        write(f"== {self.title}: {counts['passed']} passed, {counts['skipped']} skipped{unlisted}, "
              f"{counts['failed']} failed, "
              f"{counts['xfailed']} known shoal defects (issue 28), {counts['xpassed']} of those now passing")
        for nodeid, reason in sorted(self.defect_items.items()):
            write(f"   known shoal defect [{self.outcomes.get(nodeid, 'not run')}] {nodeid}: {reason}")
        stale = [p for p in (*self.skips, *self.defects) if p not in self.used]
        for p in stale:
            write(f"   list entry that matched no test: {p}")
        summary = os.environ.get("SHOAL_CONFORMANCE_SUMMARY")
        if summary:
            Path(summary).write_text(json.dumps({
                "title": self.title, "counts": counts, "files": by_file, "defects": {
                    nodeid: {"reason": reason, "outcome": self.outcomes.get(nodeid, "not run")}
                    for nodeid, reason in self.defect_items.items()}}))
