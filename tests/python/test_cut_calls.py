"""A forced tool call cut off by the token budget, read by the official `openai` and `anthropic` SDKs
against the real `shoal serve`: OpenAI chat gives the partial `tool_calls` entry with
`finish_reason: "length"` (streamed and not), the Responses
API an incomplete `function_call` item, Anthropic an incomplete `tool_use` block with
`stop_reason: "max_tokens"` (its input as far as it parses; the SDK's stream helper does not crash).
Never shoal's call format as text. Also: `/v1/completions` without `max_tokens` stops at 16 tokens."""

import json

import anthropic
import pytest

from conftest import MODEL_ID

PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": PARAMETERS}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def forced(client, max_tokens, **kwargs):
    return client.chat.completions.create(
        model=MODEL_ID, messages=QUESTION, temperature=0, max_tokens=max_tokens, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, **kwargs)


@pytest.fixture(scope="module")
def whole(client):
    """The uncut call: its arguments and how many tokens it took."""
    r = forced(client, 80)
    assert r.choices[0].finish_reason == "tool_calls", r
    return r.choices[0].message.tool_calls[0].function.arguments, r.usage.completion_tokens


def budgets(tokens):
    return [tokens // 2 + 1, tokens - 3]


def test_openai_chat_reports_the_partial_call(client, whole):
    arguments, tokens = whole
    for budget in budgets(tokens):
        r = forced(client, budget)
        choice = r.choices[0]
        assert choice.finish_reason == "length", r
        assert not choice.message.content, r
        [call] = choice.message.tool_calls
        assert call.function.name in ("get_weather", ""), r
        assert arguments.startswith(call.function.arguments), (call.function.arguments, arguments)
        assert "tool_calls" not in call.function.arguments

        # Streamed (the SDK's `stream()` helper raises LengthFinishReasonError on any cut answer by design):
        # the deltas accumulate, as clients do, into the same partial call.
        name, args, reasons, text = "", "", [], ""
        for chunk in forced(client, budget, stream=True):
            for c in chunk.choices:
                text += c.delta.content or ""
                for d in c.delta.tool_calls or []:
                    assert d.index == 0 and d.id.startswith("call_")
                    name += d.function.name or ""
                    args += d.function.arguments or ""
                if c.finish_reason:
                    reasons.append(c.finish_reason)
        assert reasons == ["length"] and text == ""
        assert (name, args) == (call.function.name, call.function.arguments)


def test_openai_responses_reports_an_incomplete_function_call(client, whole):
    arguments, tokens = whole
    budget = tokens - 3
    r = client.responses.create(
        model=MODEL_ID, input="What is the weather in Paris?", temperature=0, max_output_tokens=budget,
        tools=[{"type": "function", "name": "get_weather", "parameters": PARAMETERS}],
        tool_choice={"type": "function", "name": "get_weather"})
    assert r.status == "incomplete", r
    [item] = r.output
    assert item.type == "function_call" and item.status == "incomplete", r
    assert arguments.startswith(item.arguments)
    assert r.output_text == ""


def test_anthropic_reports_an_incomplete_tool_use(server_url, whole):
    arguments, tokens = whole
    whole_input = json.loads(arguments)
    claude = anthropic.Anthropic(base_url=server_url, api_key="none", max_retries=0, timeout=120)
    params = dict(model=MODEL_ID, max_tokens=tokens - 3, messages=QUESTION, extra_body={"temperature": 0},
                  tools=[{"name": "get_weather", "description": "Current weather in a city",
                          "input_schema": PARAMETERS}],
                  tool_choice={"type": "tool", "name": "get_weather"})
    m = claude.messages.create(**params)
    assert m.stop_reason == "max_tokens", m
    [block] = m.content
    assert block.type == "tool_use" and block.name in ("get_weather", ""), m
    assert isinstance(block.input, dict)
    for key, value in block.input.items():
        if isinstance(value, str):
            assert whole_input[key].startswith(value), (block.input, whole_input)
        else:
            assert value == whole_input[key]
    with claude.messages.stream(**params) as stream:
        for _ in stream:
            pass
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"
    [sblock] = final.content
    assert sblock.type == "tool_use" and sblock.input == block.input, final


def test_completions_without_max_tokens_stop_at_sixteen(client):
    r = client.completions.create(model=MODEL_ID, prompt="Once upon a time", extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16, r
    assert r.choices[0].finish_reason == "length"
