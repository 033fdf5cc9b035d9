"""OpenAI's Responses API (`POST /v1/responses`) with the real `openai` SDK against the real binary: a plain
answer equals the chat endpoint's greedy answer for the same conversation, `instructions` and message items
render through the template, the event stream (also through the SDK's `responses.stream` helper, which
checks the events' order and item ids) adds up to the same text, the token budget ends as `incomplete`,
and documented parameters shoal does not implement are refused by name."""

import openai
import pytest

from conftest import MODEL_ID

QUESTION = "Name three colors."


def chat_answer(client, messages, max_tokens):
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0, max_tokens=max_tokens)
    return r.choices[0].message.content


def test_a_plain_input_answers_like_chat(client):
    r = client.responses.create(model=MODEL_ID, input=QUESTION, temperature=0, max_output_tokens=4)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL_ID
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.output_text == chat_answer(client, [{"role": "user", "content": QUESTION}], 4)
    assert r.usage.output_tokens == 4 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + 4


def test_instructions_and_message_items_render_through_the_template(client):
    items = [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello! How can I help?"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
    ]
    r = client.responses.create(model=MODEL_ID, instructions="Answer briefly.", input=items, temperature=0,
                                max_output_tokens=10)
    expected = chat_answer(client, [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": QUESTION},
    ], 10)
    assert r.output_text == expected


def test_the_event_stream_adds_up_to_the_same_answer(client):
    plain = client.responses.create(model=MODEL_ID, input=QUESTION, temperature=0, max_output_tokens=64)
    events = list(client.responses.create(model=MODEL_ID, input=QUESTION, temperature=0, max_output_tokens=64,
                                          parallel_tool_calls=False, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"], kinds
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == plain.output_text == events[-1].response.output_text
    assert events[-1].response.status == plain.status
    # The SDK's helper rebuilds the response from the events and checks their item ids.
    with client.responses.stream(model=MODEL_ID, input=QUESTION, temperature=0, max_output_tokens=64) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    assert final.output_text == plain.output_text


@pytest.mark.parametrize("extra, param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0]"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "no-such-model"}, "model"),
])
def test_what_shoal_does_not_do_is_refused_by_name(client, extra, param):
    args = {"model": MODEL_ID, "input": QUESTION, "max_output_tokens": 4, **extra}
    with pytest.raises(openai.APIStatusError) as err:
        client.responses.create(**args)
    assert err.value.status_code in (400, 404)
    assert err.value.body.get("param") == param, err.value.body


WEATHER = {
    "type": "function", "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False},
}


def test_a_forced_function_call_is_a_valid_call(client):
    import json

    import jsonschema

    for choice in ("required", {"type": "function", "name": "get_weather"}):
        r = client.responses.create(model=MODEL_ID, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice=choice, temperature=0, max_output_tokens=300,
                                    parallel_tool_calls=False)
        calls = [o for o in r.output if o.type == "function_call"]
        assert calls, r.output
        assert calls[0].name == "get_weather" and calls[0].call_id
        jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    # Streamed: the call arrives as its own item, with the same arguments.
    events = list(client.responses.create(model=MODEL_ID, input="What is the weather in Paris?", tools=[WEATHER],
                                          tool_choice="required", temperature=0, max_output_tokens=300,
                                          parallel_tool_calls=False, stream=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    final = events[-1].response
    assert done and done[0].arguments == calls[0].arguments
    assert [o.type for o in final.output if o.type == "function_call"] == ["function_call"]


def test_a_two_turn_tool_conversation_renders_and_answers(client):
    first = client.responses.create(model=MODEL_ID, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice="required", temperature=0, max_output_tokens=300,
                                    parallel_tool_calls=False)
    call = next(o for o in first.output if o.type == "function_call")
    second = client.responses.create(
        model=MODEL_ID, tools=[WEATHER], temperature=0, max_output_tokens=30, tool_choice="none",
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21, "sky": "sunny"}'}])
    assert second.output_text.strip(), second.output
    assert not [o for o in second.output if o.type == "function_call"]
    # A function_call_output must answer a call the conversation made.
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL_ID, input=[{"type": "function_call_output", "call_id": "nope",
                                                        "output": "x"}], max_output_tokens=4)
    assert err.value.body.get("param") == "input[0].call_id"


def test_a_json_schema_answer_parses_and_validates(client):
    import json

    import jsonschema

    schema = {"type": "object", "properties": {"colors": {"type": "array", "items": {"type": "string"},
                                                          "minItems": 3, "maxItems": 3}},
              "required": ["colors"], "additionalProperties": False}
    r = client.responses.create(model=MODEL_ID, input=QUESTION, temperature=0, max_output_tokens=60,
                                text={"format": {"type": "json_schema", "name": "colors", "schema": schema,
                                                 "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL_ID, input=QUESTION, max_output_tokens=4,
                                tools=[{"type": "web_search"}])
    assert err.value.body.get("param") == "tools[0].type"


def test_a_two_node_pipeline_answers_through_either_node(client, pipeline):
    from test_cluster import wait_until

    alone = client.responses.create(model=MODEL_ID, input=QUESTION, temperature=0, max_output_tokens=16)
    forced = dict(model=MODEL_ID, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
                  temperature=0, max_output_tokens=300, parallel_tool_calls=False)
    lone_call = next(o for o in client.responses.create(**forced).output if o.type == "function_call")
    for node in pipeline:  # the first drives the instance, the second forwards to it
        remote = openai.OpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0, timeout=180)

        def served():
            try:
                return remote.responses.create(model=MODEL_ID, input=QUESTION, temperature=0, max_output_tokens=16)
            except openai.NotFoundError:
                return None

        whole = wait_until(f"{node.url} to serve the model", served)
        assert whole.output_text == alone.output_text
        events = list(remote.responses.create(model=MODEL_ID, input=QUESTION, temperature=0, max_output_tokens=16,
                                              stream=True))
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == alone.output_text
        # The forced call's token masks travel to the stage that samples, on the other node.
        call = next(o for o in remote.responses.create(**forced).output if o.type == "function_call")
        assert (call.name, call.arguments) == (lone_call.name, lone_call.arguments)
