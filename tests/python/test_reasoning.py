"""Reasoning output through the real SDKs: a real `shoal serve` on the synthetic Qwen 3 whose template thinks
(crates/shoal-model/tests/fixtures/synth/qwen3-think-s-f16.gguf: an R1-style template whose generation prompt
opens `<think>`). The random-weight model never closes its thoughts within the budget, so everything it writes
is reasoning — unless the request turns thinking off, when the prompt closes the block and the answer is
content."""


import ollama
import openai
import pytest

from conftest import REPO, ShoalNode

FIXTURE = REPO / "crates/shoal-model/tests/fixtures/synth/qwen3-think-s-f16.gguf"
MESSAGES = [{"role": "user", "content": "What is 7 times 8?"}]


@pytest.fixture(scope="module")
def node():
    n = ShoalNode("--model", str(FIXTURE), key="python-tests-reasoning")
    try:
        yield n
    finally:
        n.kill()


def model_id(url: str) -> str:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x").models.list().data[0].id


def test_openai_sdk_reads_reasoning_content_streamed_and_not(node):
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0, timeout=60)
    model = model_id(node.url)
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0)
    message = r.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and message.content == ""
    streamed = "".join(
        (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        for chunk in client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=12, temperature=0, stream=True)
        if chunk.choices
    )
    assert streamed == reasoning
    off = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0,
                                         reasoning_effort="none")
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {})
    assert off.choices[0].message.content
    kwargs = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0,
                                            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert kwargs.choices[0].message.content == off.choices[0].message.content


def test_ollama_sdk_reads_thinking_and_think_false_turns_it_off(node):
    oc = ollama.Client(host=node.url, timeout=60)
    model = model_id(node.url)
    r = oc.chat(model=model, messages=MESSAGES, options={"num_predict": 12, "temperature": 0}, think=True)
    assert r.message.thinking and r.message.content == ""
    streamed = "".join(p.message.thinking or "" for p in oc.chat(
        model=model, messages=MESSAGES, options={"num_predict": 12, "temperature": 0}, think=True, stream=True))
    assert streamed == r.message.thinking
    off = oc.chat(model=model, messages=MESSAGES, options={"num_predict": 12, "temperature": 0}, think=False)
    assert not off.message.thinking and off.message.content
    g = oc.generate(model=model, prompt="What is 7 times 8?", options={"num_predict": 12, "temperature": 0})
    assert g.thinking == r.message.thinking and g.response == ""


def test_anthropic_sdk_reads_thinking_blocks_when_thinking_is_enabled(node):
    import anthropic

    claude = anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0, timeout=60)
    model = model_id(node.url)
    thinking = {"type": "enabled", "budget_tokens": 1024}
    r = claude.messages.create(model=model, max_tokens=12, messages=MESSAGES, thinking=thinking,
                               extra_body={"temperature": 0})
    assert [b.type for b in r.content] == ["thinking"] and r.content[0].thinking
    with claude.messages.stream(model=model, max_tokens=12, messages=MESSAGES, thinking=thinking,
                                extra_body={"temperature": 0}) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == r.content[0].thinking
    # Without `thinking` (Anthropic's default) the model answers without its thoughts.
    plain = claude.messages.create(model=model, max_tokens=12, messages=MESSAGES, extra_body={"temperature": 0})
    assert [b.type for b in plain.content] == ["text"] and plain.content[0].text
    # The thinking block sent back with the conversation is accepted.
    again = claude.messages.create(model=model, max_tokens=4, messages=[
        *MESSAGES, {"role": "assistant", "content": r.content}, {"role": "user", "content": "And 8 times 9?"}],
        thinking=thinking)
    assert again.content
    # A budget smaller than the thoughts: they are closed when spent (a prefix of the free ones), streamed
    # alike, and the model answers after them.
    small = {"type": "enabled", "budget_tokens": 4}
    cut = claude.messages.create(model=model, max_tokens=24, messages=MESSAGES, thinking=small,
                                 extra_body={"temperature": 0})
    assert [b.type for b in cut.content] == ["thinking", "text"], cut.content
    assert r.content[0].thinking.startswith(cut.content[0].thinking.rstrip()) and cut.content[1].text
    with claude.messages.stream(model=model, max_tokens=24, messages=MESSAGES, thinking=small,
                                extra_body={"temperature": 0}) as stream:
        streamed = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in streamed.content] == \
        [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in cut.content]


def test_openai_sdk_responses_carry_a_reasoning_item(node):
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0, timeout=60)
    model = model_id(node.url)
    r = client.responses.create(model=model, input="What is 7 times 8?", max_output_tokens=12, temperature=0)
    assert [item.type for item in r.output] == ["reasoning"]
    thoughts = r.output[0].content[0].text
    assert thoughts
    deltas = [e.delta for e in client.responses.create(model=model, input="What is 7 times 8?",
                                                       max_output_tokens=12, temperature=0, stream=True)
              if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == thoughts
    off = client.responses.create(model=model, input="What is 7 times 8?", max_output_tokens=12, temperature=0,
                                  reasoning={"effort": "none"})
    assert [item.type for item in off.output] == ["message"] and off.output_text
