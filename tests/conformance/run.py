"""The conformance step of scripts/test: llama.cpp's server test suite (fetched, see suite.py) through
llama_adapter.py, then the client-library tests of this folder (litellm, LangChain, the `llm` CLI, Vercel's
AI SDK), each against a real `shoal serve` ($SHOAL_BIN, the default test model); prints both runs' counts,
each test file's, and the known shoal defects, and fails when a test fails. Extra arguments go to both pytest
runs (e.g. `-x`, `-k name`)."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import suite  # noqa: E402

# llama.cpp's test files of the OpenAI surface: chat completions, completions, tool calls, embeddings,
# the models list (test_basic) and errors (test_security: API keys; invalid requests are in the others);
# and of the Responses and Anthropic Messages APIs.
LLAMA_FILES = ["unit/test_basic.py", "unit/test_chat_completion.py", "unit/test_completion.py",
               "unit/test_tool_call.py", "unit/test_embedding.py", "unit/test_security.py",
               "unit/test_compat_oai_responses.py", "unit/test_compat_anthropic.py"]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::UserWarning", "-rfE"]


def _run(args: "list[str]", cwd: Path, summary: Path) -> "tuple[int, dict]":
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
           "SHOAL_CONFORMANCE_SUMMARY": str(summary), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    rc = subprocess.run(args, cwd=cwd, env=env).returncode
    result = json.loads(summary.read_text()) if summary.is_file() else {"title": " ".join(args), "counts": {}}
    return rc, result


def main(extra: "list[str]") -> int:
    llama = suite.llama_server_tests()
    with tempfile.TemporaryDirectory(prefix="shoal-conformance-") as tmp:
        runs = [
            _run([*PYTEST, "-p", "llama_adapter", *extra, *LLAMA_FILES], llama, Path(tmp, "llama.json")),
            _run([*PYTEST, *extra, str(HERE)], HERE.parents[1], Path(tmp, "clients.json")),
        ]
    print("\n== conformance summary")
    failed = False
    for rc, result in runs:
        c = result["counts"]
        slow = c.get("skipped_unlisted")
        slow = f" ({slow} marked slow upstream, the rest by the list)" if slow else ""
        print(f"   {result['title']}: {c.get('passed', 0)} passed, {c.get('skipped', 0)} skipped{slow}, "
              f"{c.get('failed', 0)} failed, "
              f"{c.get('xfailed', 0) + c.get('xpassed', 0)} known shoal defects (issue 28)"
              + ("" if rc == 0 else f" — pytest exited with {rc}"))
        for file, fc in sorted(result.get("files", {}).items()):
            print(f"      {file}: {fc.get('passed', 0)} passed, {fc.get('skipped', 0)} skipped, "
                  f"{fc.get('failed', 0)} failed, {fc.get('xfailed', 0) + fc.get('xpassed', 0)} known defects")
        for nodeid, defect in sorted(result.get("defects", {}).items()):
            print(f"      known shoal defect [{defect['outcome']}] {nodeid}: {defect['reason']}")
        failed |= rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
