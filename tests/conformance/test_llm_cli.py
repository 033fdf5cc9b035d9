"""Simon Willison's `llm` CLI against a real shoal, as its users run it: shoal as an OpenAI-compatible model
(`extra-openai-models.yaml`) and, through the llm-ollama plugin, as an Ollama server (`OLLAMA_HOST`). A
prompt streamed and not, a system prompt, a conversation continued with `-c`, options (`-o`: temperature,
the token cap, JSON mode, stop), tools (`--functions`) and schemas (`--schema`, `--schema-multi`). Each
command runs in its own process with a fresh user dir, and what it logged (`--json`, or `llm logs --json`)
is what the tests read."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MODEL
from tools import PROMPT, STRUCTURED_PROMPT, TOOL_PROMPT, Person, check_weather_args

TIMEOUT_S = 120
# backend -> (the model id llm knows shoal by, the option that caps the answer's tokens)
BACKENDS = {"openai": ("shoal", "max_tokens"), "ollama": (f"ollama/{MODEL}", "num_predict")}
LONG_PROMPT = "Write a long story about a dragon who learns to fly."

# The tool as llm's `--functions` takes it: a Python function whose calls are appended to a file, so
# the test sees what llm actually invoked (the function's docstring is the tool's description).
FUNCTIONS = '''
import json, os


def GetWeather(city: str) -> str:
    """Get the current weather of a city."""
    with open(os.environ["SHOAL_TOOL_CALLS"], "a") as f:
        f.write(json.dumps({"city": city}) + "\\n")
    return f"It is sunny in {city}."
'''


class Llm:
    """The `llm` command with its own user dir (its config and logs.db) pointed at shoal."""

    def __init__(self, shoal_url: str, home: Path):
        home.mkdir(parents=True, exist_ok=True)
        (home / "extra-openai-models.yaml").write_text(
            f"- model_id: shoal\n  model_name: {MODEL}\n  api_base: {shoal_url}/v1\n"
            "  supports_tools: true\n  supports_schema: true\n")
        self.tool_calls = home / "tool-calls.jsonl"
        self.env = {**os.environ, "LLM_USER_PATH": str(home), "OLLAMA_HOST": shoal_url,
                    "SHOAL_TOOL_CALLS": str(self.tool_calls)}
        self.home = home

    def run(self, *args: str) -> str:
        # llm-ollama asks the server for its models at every start of llm: commands that use no Ollama
        # model (the OpenAI-compatible one, `llm logs`) load no plugin, which saves about a second each.
        ollama = any(a.startswith("ollama/") for a in args)
        env = self.env if ollama else {**self.env, "LLM_LOAD_PLUGINS": ""}
        p = subprocess.run([sys.executable, "-m", "llm", *args], env=env, capture_output=True, text=True,
                           timeout=TIMEOUT_S, cwd=self.home)
        assert p.returncode == 0, f"llm {' '.join(args)} exited with {p.returncode}:\n{p.stderr}"
        return p.stdout

    def prompt(self, backend: str, *args: str, max_tokens: int = 32) -> dict:
        """One prompt, not streamed (llm's `--json` asks for the whole answer): its log record."""
        model, cap = BACKENDS[backend]
        records = json.loads(self.run("-m", model, "-o", cap, str(max_tokens), *args, "--json"))
        assert len(records) == 1, records
        return records[0]

    def logs(self, n: int) -> "list[dict]":
        """The last `n` log records, oldest first."""
        return json.loads(self.run("logs", "-n", str(n), "--json"))


@pytest.fixture
def llm_cli(shoal_url, tmp_path) -> Llm:
    return Llm(shoal_url, tmp_path / "llm")


def _check_answer(record: dict, max_tokens: int) -> None:
    assert record["response"].strip(), record
    assert 0 < record["output_tokens"] <= max_tokens, record
    assert record["input_tokens"] > 0, record


@pytest.mark.parametrize("backend", BACKENDS)
def test_prompt(llm_cli, backend):
    _check_answer(llm_cli.prompt(backend, "-o", "temperature", "0", PROMPT), 32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prompt_streamed(llm_cli, backend):
    model, cap = BACKENDS[backend]
    out = llm_cli.run("-m", model, "-o", cap, "32", "-o", "temperature", "0", PROMPT)
    [record] = llm_cli.logs(1)
    assert out.strip() == record["response"].strip()
    _check_answer(record, 32)
    if backend == "openai":  # llm logs the last chunk of a stream
        assert record["response_json"]["object"] == "chat.completion.chunk", record["response_json"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_system_prompt(llm_cli, backend):
    """The system prompt reaches shoal: a longer one costs more prompt tokens there."""
    short = llm_cli.prompt(backend, "-s", "Be brief.", PROMPT, max_tokens=8)
    long = llm_cli.prompt(backend, "-s", "Be brief. Answer in English, in one short sentence, and never ask a "
                                         "question back.", PROMPT, max_tokens=8)
    assert short["system"] == "Be brief."
    _check_answer(short, 8)
    _check_answer(long, 8)
    assert long["input_tokens"] >= short["input_tokens"] + 10, (short["input_tokens"], long["input_tokens"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_conversation(llm_cli, backend):
    """`-c` sends the first exchange again: the second prompt holds the first one and its answer."""
    first = llm_cli.prompt(backend, "-o", "temperature", "0", "My name is Ada. Say hello to me.", max_tokens=16)
    second = llm_cli.prompt(backend, "-c", "-o", "temperature", "0", "What is my name?", max_tokens=16)
    _check_answer(first, 16)
    _check_answer(second, 16)
    assert second["conversation_id"] == first["conversation_id"]
    assert second["input_tokens"] > first["input_tokens"] + first["output_tokens"], (first, second)


@pytest.mark.parametrize("backend", BACKENDS)
def test_options(llm_cli, backend):
    """`-o temperature 0` is greedy (the same answer twice) and the token cap ends a long answer."""
    a = llm_cli.prompt(backend, "-o", "temperature", "0", LONG_PROMPT, max_tokens=8)
    b = llm_cli.prompt(backend, "-o", "temperature", "0", LONG_PROMPT, max_tokens=8)
    assert a["response"] == b["response"] and a["response"].strip()
    assert a["output_tokens"] == 8, a
    finish = (a["response_json"]["choices"][0]["finish_reason"] if backend == "openai"
              else a["response_json"]["done_reason"])
    assert finish == "length", a["response_json"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no_stream"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_schema(llm_cli, backend, stream):
    """`--schema` (llm's DSL) is shoal's constrained decoding: the answer is JSON of that schema."""
    model, cap = BACKENDS[backend]
    out = llm_cli.run("-m", model, "-o", cap, "64", "-o", "temperature", "0", "--schema", "name, age int",
                      STRUCTURED_PROMPT, *([] if stream else ["--no-stream"]))
    person = Person.model_validate(json.loads(out))
    assert person.name.strip(), out
    answer = out.strip()  # as shoal wrote it (llm prints the answer and a newline)
    assert "\n" not in answer and "  " not in answer, f"whitespace runs in constrained JSON: {answer!r}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_schema_multi(llm_cli, backend):
    """`--schema-multi`: an object whose `items` are each of the schema."""
    model, cap = BACKENDS[backend]
    out = llm_cli.run("-m", model, "-o", cap, "96", "-o", "temperature", "0", "--schema-multi", "name, age int",
                      "Extract the people: John is 30 and Mary is 25.")
    items = json.loads(out)["items"]
    assert items and all(Person.model_validate(item).name.strip() for item in items), out


@pytest.mark.parametrize("backend", BACKENDS)
def test_json_object(llm_cli, backend):
    """`-o json_object 1`: JSON mode (OpenAI's response_format json_object, Ollama's format "json")."""
    record = llm_cli.prompt(backend, "-o", "json_object", "1", "-o", "temperature", "0",
                            "Give me a JSON object with the name and country of Paris.", max_tokens=64)
    assert isinstance(json.loads(record["response"]), dict), record["response"]


def test_stop(llm_cli):
    """`-o stop` (OpenAI's; llm cannot pass llm-ollama's list-valued `stop` from the command line): the
    answer ends before the stop sequence, and its text up to there is the answer without a stop."""
    full = llm_cli.prompt("openai", "-o", "temperature", "0", PROMPT, max_tokens=48)["response"]
    # The stop sequence: the answer's second word of four letters or more, so it is met whatever this
    # CPU's greedy answer is.
    words = re.findall(r"[A-Za-z]{4,}", full)
    assert words, full
    stop = words[min(1, len(words) - 1)]
    stopped = llm_cli.prompt("openai", "-o", "temperature", "0", "-o", "stop", stop, PROMPT, max_tokens=48)
    text = stopped["response"]
    assert stop not in text and stopped["response_json"]["choices"][0]["finish_reason"] == "stop", stopped
    # Greedy: the same answer, cut where the stop sequence began.
    assert full.index(stop) == len(text) and full.startswith(text), (full, text, stop)


@pytest.mark.parametrize("max_tokens", [12, 40, 64], ids=["cut_in_prose", "cut_before_name", "cut_in_call"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_functions_cut_off(llm_cli, backend, max_tokens):
    """A tool offered and the answer ended by the token cap: the same answer streamed and not, at
    temperature 0. (To this prompt the model writes a sentence, then a markdown JSON block that describes
    a call: cut in the sentence, before the call's name or inside the call, it is text either way.)"""
    functions = llm_cli.home / "functions.py"
    functions.write_text(FUNCTIONS)
    model, cap = BACKENDS[backend]
    args = ["-m", model, "-o", cap, str(max_tokens), "-o", "temperature", "0", "--functions", str(functions),
            "--cl", "2", "Use a tool to find the weather in Paris."]
    streamed = llm_cli.run(*args).strip()
    assert streamed
    assert llm_cli.run(*args, "--no-stream").strip() == streamed


@pytest.mark.parametrize("backend", BACKENDS)
def test_functions(llm_cli, backend):
    """llm cannot force a call (it sends no tool_choice): the answer is text, or a call of the tool that llm
    ran with valid arguments and whose result it sent back for a final answer. Either way the tool reached
    shoal, which describes it to the model in the prompt."""
    functions = llm_cli.home / "functions.py"
    functions.write_text(FUNCTIONS)
    model, cap = BACKENDS[backend]
    llm_cli.run("-m", model, "-o", cap, "64", "-o", "temperature", "0", "--functions", str(functions),
                "--cl", "2", TOOL_PROMPT)
    records = llm_cli.logs(3)
    records = records[next(i for i, r in enumerate(records) if r["prompt"] == TOOL_PROMPT):]
    first = records[0]
    assert [t["name"] for t in first["tools"]] == ["GetWeather"], first["tools"]
    plain = llm_cli.prompt(backend, TOOL_PROMPT, max_tokens=1)
    assert first["input_tokens"] >= plain["input_tokens"] + 30, (first["input_tokens"], plain["input_tokens"])
    if first["tool_calls"]:
        ran = [json.loads(line) for line in llm_cli.tool_calls.read_text().splitlines()]
        assert len(ran) == len(first["tool_calls"]) >= 1
        for call, args in zip(first["tool_calls"], ran):
            assert call["name"] == "GetWeather"
            check_weather_args(call["arguments"])
            assert args == call["arguments"] if isinstance(call["arguments"], dict) else json.loads(
                call["arguments"])
        assert len(records) >= 2 and records[1]["tool_results"], records
        assert records[1]["response"].strip() or records[1]["tool_calls"], records[1]
    else:
        assert first["response"].strip(), first
        assert not llm_cli.tool_calls.exists(), "llm ran a tool that no logged call asked for"
