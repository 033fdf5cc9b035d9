"""gpt-oss's harmony format through the real SDKs: a real `shoal serve` on the synthetic model whose template
writes harmony's channels (crates/shoal-model/tests/fixtures/synth/qwen3-harmony-s-f16.gguf, made by
scripts/synth/harmony_fixture.py: gpt-oss's tokenizer and special tokens, a harmony template whose generation
prompt opens an analysis message when `reasoning_effort` is "high"). The analysis is `reasoning_content`, a
forced call is harmony's commentary message read back as the SDK's tool call, and no special token of the
format ever reaches the text."""

import json

import ollama
import openai
import pytest

from conftest import REPO, ShoalNode

FIXTURE = REPO / "crates/shoal-model/tests/fixtures/synth/qwen3-harmony-s-f16.gguf"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
SPECIALS = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>", "<|call|>", "<|return|>")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}
FORCE = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def node():
    n = ShoalNode("--model", str(FIXTURE), key="python-tests-harmony")
    try:
        yield n
    finally:
        n.kill()


def client(node) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0, timeout=60)


def model_id(c: openai.OpenAI) -> str:
    return c.models.list().data[0].id


def clean(text: str | None) -> bool:
    return not any(s in (text or "") for s in SPECIALS)


def test_openai_sdk_reads_the_analysis_as_reasoning_content(node):
    c = client(node)
    model = model_id(c)
    r = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0,
                                  reasoning_effort="high")
    message = r.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning_content")
    assert reasoning and clean(reasoning) and clean(message.content)
    streamed, content = "", ""
    for chunk in c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0,
                                           reasoning_effort="high", stream=True):
        if chunk.choices:
            streamed += (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            content += chunk.choices[0].delta.content or ""
    assert streamed == reasoning and content == (message.content or "")
    # At the default effort the prompt ends at `<|start|>assistant`; whatever the model writes shows no
    # special token.
    plain = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0)
    assert clean(plain.choices[0].message.content)
    assert clean((plain.choices[0].message.model_extra or {}).get("reasoning_content"))


def test_openai_sdk_reads_a_forced_call_as_tool_calls_streamed_or_not(node):
    c = client(node)
    model = model_id(c)
    r = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=80, temperature=0,
                                  tools=[WEATHER], tool_choice=FORCE)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert isinstance(args["city"], str)
    assert clean(choice.message.content)
    parts = {}
    for chunk in c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=80, temperature=0,
                                           tools=[WEATHER], tool_choice=FORCE, stream=True):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = parts.setdefault(d.index, {"name": "", "arguments": ""})
            entry["name"] += (d.function.name or "") if d.function else ""
            entry["arguments"] += (d.function.arguments or "") if d.function else ""
    assert parts == {0: {"name": "get_weather", "arguments": call.function.arguments}}
    # The call sent back with its result renders, and the conversation goes on.
    again = c.chat.completions.create(model=model, max_tokens=4, temperature=0, messages=[
        *MESSAGES, choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C"}])
    assert clean(again.choices[0].message.content)
    # Cut by max_tokens inside its arguments: the call cut short, never text.
    cut = c.chat.completions.create(model=model, messages=MESSAGES, max_tokens=r.usage.completion_tokens - 2,
                                    temperature=0, tools=[WEATHER], tool_choice=FORCE)
    assert cut.choices[0].finish_reason == "length"
    assert cut.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert call.function.arguments.startswith(cut.choices[0].message.tool_calls[0].function.arguments)
    assert clean(cut.choices[0].message.content)


def test_ollama_thinks_at_a_level_and_anthropic_reads_the_forced_call(node):
    import anthropic

    model = model_id(client(node))
    oc = ollama.Client(host=node.url, timeout=60)
    # Ollama's `think` level is gpt-oss's reasoning effort.
    r = oc.chat(model=model, messages=MESSAGES, options={"num_predict": 16, "temperature": 0}, think="high")
    assert r.message.thinking and clean(r.message.thinking) and clean(r.message.content)
    streamed = "".join(p.message.thinking or "" for p in oc.chat(
        model=model, messages=MESSAGES, options={"num_predict": 16, "temperature": 0}, think="high", stream=True))
    assert streamed == r.message.thinking
    claude = anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0, timeout=60)
    m = claude.messages.create(model=model, max_tokens=80, messages=MESSAGES, extra_body={"temperature": 0},
                               tools=[{"name": "get_weather", "description": "Weather of a city",
                                       "input_schema": WEATHER["function"]["parameters"]}],
                               tool_choice={"type": "tool", "name": "get_weather"})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses[0].name == "get_weather" and isinstance(uses[0].input["city"], str)
