"""Structured output and tool calls with the official `openai` SDK against the real `shoal serve`.

SmolLM2's chat template prints no tools, so shoal describes them in a system paragraph and the model
calls them in the generic JSON format; where `tool_choice` forces a call (or `response_format` a
schema) the grammar makes the output valid whatever the 135M model would have written. Also on a
2-node pipeline, where the last stage samples on the other node (the token masks travel there).
"""

import json

import jsonschema
import openai
import pytest

from conftest import MODEL_ID
from test_cluster import wait_until

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Current time"}}

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}


def _person(client, **kwargs):
    return client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Describe Ann, 31, who likes chess, as JSON."}],
        temperature=0,
        max_tokens=100,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        **kwargs,
    )


def _forced_call(client, **kwargs):
    return client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        temperature=0,
        max_tokens=100,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        **kwargs,
    )


def _check_weather_call(call):
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    return args


def test_a_json_schema_answer_parses_and_validates(client):
    resp = _person(client)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    person = json.loads(choice.message.content)
    jsonschema.validate(person, PERSON)
    # The same answer streamed.
    streamed = "".join(
        c.choices[0].delta.content or "" for c in _person(client, stream=True) if c.choices
    )
    assert streamed == choice.message.content


def test_json_object_is_a_json_object(client):
    resp = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "List two fruits as a JSON object."}],
        temperature=0,
        max_tokens=60,
        response_format={"type": "json_object"},
    )
    text = resp.choices[0].message.content
    if resp.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert text.lstrip().startswith("{")


def test_the_sdk_parse_helper_reads_the_schema_answer(client):
    # `parse` sends the schema of a pydantic-free response_format dict and reads the JSON back.
    resp = client.chat.completions.parse(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Describe Ann, 31, who likes chess."}],
        temperature=0,
        max_tokens=100,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    jsonschema.validate(json.loads(resp.choices[0].message.content), PERSON)


def test_a_forced_tool_call_comes_back_as_a_valid_call(client):
    resp = _forced_call(client)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    _check_weather_call(choice.message.tool_calls[0])


def test_a_forced_tool_call_streams_as_tool_call_deltas(client):
    whole = _forced_call(client).choices[0].message.tool_calls[0]
    calls, finish, text = {}, [], []
    for chunk in _forced_call(client, stream=True):
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                text.append(delta.content)
            for tc in delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = tc.id or entry["id"]
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert finish == ["tool_calls"]
    assert "".join(text) == ""
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    assert calls[0]["arguments"] == whole.function.arguments
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER["function"]["parameters"])


def test_required_gives_at_least_one_call_of_the_tools(client):
    resp = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "What time is it?"}],
        temperature=0,
        max_tokens=100,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name in ("get_weather", "get_time")
    if call.function.name == "get_weather":
        _check_weather_call(call)
    else:
        assert isinstance(json.loads(call.function.arguments), dict)


def test_a_two_turn_tool_conversation_renders_and_answers(client):
    first = _forced_call(client).choices[0].message
    call = first.tool_calls[0]
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    resp = client.chat.completions.create(
        model=MODEL_ID, messages=history, temperature=0, max_tokens=30, tools=[WEATHER, TIME], tool_choice="none"
    )
    choice = resp.choices[0]
    assert choice.message.tool_calls is None
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    # The call and its result are in the prompt: longer than the question alone with the same tools.
    alone = client.chat.completions.create(
        model=MODEL_ID, messages=history[:1], temperature=0, max_tokens=1, tools=[WEATHER, TIME], tool_choice="none"
    )
    assert resp.usage.prompt_tokens > alone.usage.prompt_tokens + 20


def test_bad_tool_requests_are_400s_naming_the_field(client):
    cases = [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
            "response_format",
        ),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=4, **extra
            )
        assert err.value.status_code == 400
        assert err.value.body["param"] == param
    # The server keeps serving.
    assert client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    ).choices[0].message.content is not None


def _served(client: openai.OpenAI):
    try:
        return client.models.retrieve(MODEL_ID)
    except openai.NotFoundError:
        return None


def test_a_two_node_pipeline_constrains_and_calls(pipeline, client):
    alone = _forced_call(client).choices[0].message.tool_calls[0]
    for node in pipeline:
        remote = openai.OpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0, timeout=180)
        wait_until(f"{node.url} to serve the model", lambda: _served(remote))
        call = _forced_call(remote).choices[0].message.tool_calls[0]
        _check_weather_call(call)
        assert call.function.arguments == alone.function.arguments
        person = json.loads(_person(remote).choices[0].message.content)
        jsonschema.validate(person, PERSON)
