"""The official `anthropic` Python SDK against the real `shoal serve` binary and the real model: messages
(streaming through `messages.stream` and `create(stream=True)`, and not), count_tokens, the system prompt,
stop sequences, stop reasons, the same greedy text as the OpenAI chat route, API keys sent as `x-api-key`,
the SDK's typed exceptions for bad input, tools (forced calls as tool_use blocks, streamed, a tool_result
turn, count_tokens with tools), structured output through `output_config.format`, and a model split over a
2-node pipeline (text and a forced tool call, asked of the driving node and of the other one).

The single-node server fixture lives in conftest.py (shared with the other SDK suites)."""

import json

import anthropic
import httpx
import openai
import pytest

from conftest import MODEL_ID, ShoalNode
from test_cluster import wait_until

QUESTION = "Tell me a long story about a dragon."
KEY = "anthropic-s3cret"


def messages(question: str = QUESTION, temperature: float = 0, **kwargs) -> dict:
    """Greedy by default. This SDK version has no typed `temperature` argument (Anthropic's newest models
    dropped it); the API still documents it, so it goes in the body."""
    params = {
        "model": MODEL_ID,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": question}],
        "extra_body": {"temperature": temperature},
    }
    params.update(kwargs)
    return params


def sdk(url: str, key: str = "not-needed") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(server_url) -> anthropic.Anthropic:
    return sdk(server_url)


def text_of(message) -> str:
    assert [block.type for block in message.content] == ["text"], message
    return message.content[0].text


def prompt_tokens(usage) -> int:
    """The whole prompt: computed (`input_tokens`) plus read from shoal's prefix cache."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_a_message(claude):
    m = claude.messages.create(**messages())
    assert m.id.startswith("msg_")
    assert (m.type, m.role, m.model) == ("message", "assistant", MODEL_ID)
    assert text_of(m)
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert m.usage.output_tokens == 16
    assert m.usage.cache_creation_input_tokens == 0
    count = claude.messages.count_tokens(model=MODEL_ID, messages=[{"role": "user", "content": QUESTION}])
    assert count.input_tokens == prompt_tokens(m.usage) > 5


def test_the_stream_helper_gives_the_same_message(claude):
    whole = claude.messages.create(**messages())
    with claude.messages.stream(**messages()) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1
    assert "".join(pieces) == text_of(whole) == text_of(final)
    assert final.stop_reason == "max_tokens" and final.stop_sequence is None
    assert final.usage.output_tokens == 16
    assert prompt_tokens(final.usage) == prompt_tokens(whole.usage)
    assert final.id.startswith("msg_")


def test_create_with_stream_true_sends_anthropics_events_in_order(claude):
    events = list(claude.messages.create(**messages(max_tokens=8), stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"], kinds
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds
    assert set(kinds[2:-3]) == {"content_block_delta"}, kinds
    start = events[0].message
    assert start.content == [] and start.stop_reason is None and start.usage.input_tokens > 5
    assert events[1].index == 0 and events[1].content_block.type == "text"
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == text_of(claude.messages.create(**messages(max_tokens=8)))
    delta = events[-2]
    assert delta.delta.stop_reason == "max_tokens" and delta.usage.output_tokens == 8


def test_the_system_prompt_reaches_the_model(claude):
    plain = claude.messages.create(**messages("Who are you?", max_tokens=24))
    pirate = claude.messages.create(**messages("Who are you?", max_tokens=24, system="You are a pirate named Jack."))
    blocks = claude.messages.create(
        **messages("Who are you?", max_tokens=24, system=[{"type": "text", "text": "You are a pirate named Jack."}])
    )
    assert text_of(pirate) != text_of(plain)
    assert text_of(blocks) == text_of(pirate)
    count = claude.messages.count_tokens(
        model=MODEL_ID, system="You are a pirate named Jack.", messages=[{"role": "user", "content": "Who are you?"}]
    )
    assert count.input_tokens == prompt_tokens(pirate.usage)


def test_stop_sequences_end_the_message_and_are_named(claude):
    full = text_of(claude.messages.create(**messages(max_tokens=24)))
    words = [w for w in full.split() if len(w) >= 3]
    assert len(words) >= 3, full
    stop = words[len(words) // 2]
    m = claude.messages.create(**messages(max_tokens=24, stop_sequences=["never-there", stop]))
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert text_of(m) == full[: full.index(stop)]
    with claude.messages.stream(**messages(max_tokens=24, stop_sequences=[stop])) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text_of(m)
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_a_natural_end_is_end_turn(claude):
    m = claude.messages.create(**messages("Say hi.", max_tokens=200))
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.output_tokens < 200


def test_greedy_text_equals_the_openai_chat_route(claude, server_url):
    oa = openai.OpenAI(base_url=f"{server_url}/v1", api_key="x", max_retries=0, timeout=120)
    chat = oa.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": QUESTION}], max_tokens=24, temperature=0
    )
    m = claude.messages.create(**messages(max_tokens=24))
    assert text_of(m) == chat.choices[0].message.content
    assert m.usage.output_tokens == chat.usage.completion_tokens
    assert prompt_tokens(m.usage) == chat.usage.prompt_tokens


def test_bad_input_raises_the_sdks_typed_errors(claude):
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(**messages(temperature=1.5))
    assert err.value.status_code == 400 and "temperature" in err.value.message
    assert err.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as err:
        claude.messages.create(**messages(model="claude-nope"))
    assert err.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="claude-nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(**messages(thinking={"type": "enabled", "budget_tokens": 0}))
    assert "thinking.budget_tokens" in err.value.message
    with pytest.raises(anthropic.BadRequestError) as err:
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
        claude.messages.create(**messages(messages=[{"role": "user", "content": [image]}]))
    assert "image" in err.value.message
    # The SDK insists on max_tokens itself; the server does too.
    body = messages()
    del body["max_tokens"], body["extra_body"]
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.post("/v1/messages", body=body, cast_to=httpx.Response)
    assert "max_tokens" in err.value.message
    # The server keeps serving.
    assert text_of(claude.messages.create(**messages(max_tokens=2)))


def test_an_api_key_is_sent_as_x_api_key():
    node = ShoalNode("--api-key", KEY, key="anthropic-api-key-tests")
    try:
        with pytest.raises(anthropic.AuthenticationError) as err:
            sdk(node.url, "wrong").messages.create(**messages(max_tokens=2))
        assert err.value.status_code == 401
        assert err.value.body["error"]["type"] == "authentication_error"
        m = wait_until("the model to be served", lambda: _served(sdk(node.url, KEY)))
        assert m.stop_reason == "max_tokens"
        assert sdk(node.url, KEY).messages.count_tokens(
            model=MODEL_ID, messages=[{"role": "user", "content": QUESTION}]
        ).input_tokens > 5
    finally:
        node.kill()


def _served(client: anthropic.Anthropic):
    """A short message, or None while the model is not served yet."""
    try:
        return client.messages.create(**messages(max_tokens=2))
    except anthropic.NotFoundError:
        return None


def test_a_two_node_pipeline_answers_streaming_and_not(pipeline, claude):
    a, b = pipeline
    alone = claude.messages.create(**messages(max_tokens=24))
    # b does not drive the model: it forwards to a, streams included.
    for node in (a, b):
        client = sdk(node.url)
        m = wait_until(f"{node.url} to serve the model", lambda: _served(client))
        assert m.model == MODEL_ID
        whole = client.messages.create(**messages(max_tokens=24))
        assert text_of(whole) == text_of(alone)
        assert whole.stop_reason == "max_tokens"
        with client.messages.stream(**messages(max_tokens=24)) as stream:
            assert "".join(stream.text_stream) == text_of(alone)
            assert stream.get_final_message().usage.output_tokens == 24
        count = client.messages.count_tokens(model=MODEL_ID, messages=[{"role": "user", "content": QUESTION}])
        assert count.input_tokens == prompt_tokens(whole.usage)
        # A forced call: the constraint's masks travel to the stage that samples.
        forced = messages(
            WEATHER_QUESTION, max_tokens=64, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}
        )
        [call] = tool_uses(client.messages.create(**forced))
        [lone] = tool_uses(claude.messages.create(**forced))
        assert (call.name, call.input) == (lone.name, lone.input)


WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
WEATHER_QUESTION = "What is the weather like in Paris?"


def tool_uses(message) -> list:
    return [block for block in message.content if block.type == "tool_use"]


def test_a_forced_tool_call_is_a_tool_use_block(claude):
    for choice in ({"type": "tool", "name": "get_weather"}, {"type": "any", "disable_parallel_tool_use": True}):
        m = claude.messages.create(**messages(WEATHER_QUESTION, max_tokens=64, tools=[WEATHER], tool_choice=choice))
        calls = tool_uses(m)
        assert len(calls) == 1, m
        assert calls[0].name == "get_weather" and calls[0].id
        assert isinstance(calls[0].input, dict) and isinstance(calls[0].input["city"], str), calls[0]
        assert m.stop_reason == "tool_use"


def test_a_streamed_tool_call_is_the_same_call(claude):
    params = messages(
        WEATHER_QUESTION, max_tokens=64, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}
    )
    whole = tool_uses(claude.messages.create(**params))[0]
    with claude.messages.stream(**params) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds, kinds
    [call] = tool_uses(final)
    assert (call.name, call.input) == (whole.name, whole.input)
    assert final.stop_reason == "tool_use"


def test_a_tool_result_goes_back_to_the_model(claude):
    first = claude.messages.create(
        **messages(WEATHER_QUESTION, max_tokens=64, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    )
    [call] = tool_uses(first)
    history = [
        {"role": "user", "content": WEATHER_QUESTION},
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 C."}]},
    ]
    second = claude.messages.create(**messages(max_tokens=48, tools=[WEATHER], messages=history))
    assert second.content and second.stop_reason in ("end_turn", "tool_use", "max_tokens"), second
    count = claude.messages.count_tokens(model=MODEL_ID, tools=[WEATHER], messages=history)
    assert count.input_tokens == prompt_tokens(second.usage)
    without_tools = claude.messages.count_tokens(model=MODEL_ID, messages=history)
    assert count.input_tokens > without_tools.input_tokens
    with pytest.raises(anthropic.BadRequestError) as err:
        history[2]["content"][0]["tool_use_id"] = "toolu_nope"
        claude.messages.create(**messages(max_tokens=8, tools=[WEATHER], messages=history))
    assert "tool_use_id" in err.value.message


def test_an_unknown_tool_in_tool_choice_is_a_bad_request(claude):
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(**messages(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_time"}))
    assert "tool_choice" in err.value.message and "get_time" in err.value.message


def test_an_output_format_gives_json_of_the_schema(claude):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    m = claude.messages.create(
        **messages("Invent a person.", max_tokens=80, output_config={"format": {"type": "json_schema", "schema": schema}})
    )
    answer = json.loads(text_of(m))
    assert set(answer) == {"name", "age"}
    assert isinstance(answer["name"], str) and isinstance(answer["age"], int)
