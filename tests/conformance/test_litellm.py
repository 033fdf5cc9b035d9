"""litellm's OpenAI, Anthropic and Ollama providers against a real shoal: chat, streaming, a forced tool
call (OpenAI and Anthropic: Ollama's API has no way to force one), completions and embeddings."""

import litellm
import pytest

from conftest import MODEL
from tools import PROMPT, TOOL_PROMPT, check_weather_args, weather_tool

TIMEOUT_S = 120
# provider prefix -> where litellm is told shoal is (each provider appends its own route).
PROVIDERS = {"openai": "/v1", "anthropic": "", "ollama_chat": "", "ollama": ""}


def _call(shoal_url, provider, **kwargs):
    return litellm.completion(model=f"{provider}/{MODEL}", api_base=shoal_url + PROVIDERS[provider],
                              api_key="none", temperature=0, timeout=TIMEOUT_S, num_retries=0, **kwargs)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_chat(shoal_url, provider):
    r = _call(shoal_url, provider, messages=[{"role": "user", "content": PROMPT}], max_tokens=32)
    choice = r.choices[0]
    assert choice.message.content and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 32


@pytest.mark.parametrize("provider", PROVIDERS)
def test_stream(shoal_url, provider):
    chunks = list(_call(shoal_url, provider, messages=[{"role": "user", "content": PROMPT}], max_tokens=32,
                        stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip(), f"no text in {len(chunks)} chunks"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes and finishes[-1] in ("stop", "length")


@pytest.mark.parametrize("closed", [True, False], ids=["closed_schema", "open_schema"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_forced_tool_call(shoal_url, provider, closed):
    r = _call(shoal_url, provider, messages=[{"role": "user", "content": TOOL_PROMPT}], max_tokens=128,
              tools=[weather_tool(closed)], tool_choice={"type": "function", "function": {"name": "GetWeather"}})
    message = r.choices[0].message
    assert message.tool_calls and len(message.tool_calls) == 1, f"no tool call: {message}"
    assert message.tool_calls[0].function.name == "GetWeather"
    assert message.tool_calls[0].id
    check_weather_args(message.tool_calls[0].function.arguments)
    if provider == "openai":  # the arguments as shoal wrote them: compact, as OpenAI's constrained output
        arguments = message.tool_calls[0].function.arguments
        assert "\n" not in arguments and "  " not in arguments, f"whitespace runs in {arguments!r}"


@pytest.mark.parametrize("max_tokens", [6, 16], ids=["before_name", "in_arguments"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_forced_tool_call_cut_off(shoal_url, provider, stream, max_tokens):
    """A forced call cut by max_tokens is still a (partial) call of the forced function, as OpenAI and
    Anthropic return it: never text. (6 tokens end shoal's call before the model has written the name,
    16 inside the arguments.)"""
    kwargs = dict(messages=[{"role": "user", "content": TOOL_PROMPT}], max_tokens=max_tokens,
                  tools=[weather_tool(True)],
                  tool_choice={"type": "function", "function": {"name": "GetWeather"}})
    if stream:
        chunks = list(_call(shoal_url, provider, stream=True, **kwargs))
        message = litellm.stream_chunk_builder(chunks).choices[0].message
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    else:
        choice = _call(shoal_url, provider, **kwargs).choices[0]
        message, finish = choice.message, choice.finish_reason
    assert finish == "length"
    assert not message.content, f"the cut call came back as text: {message.content!r}"
    assert message.tool_calls and message.tool_calls[0].function.name == "GetWeather", message


def test_tool_call_ids_are_unique(shoal_url):
    """Two forced calls in the same second get different ids (ids seeded per request, not per second)."""
    kwargs = dict(messages=[{"role": "user", "content": TOOL_PROMPT}], max_tokens=64, tools=[weather_tool(True)],
                  tool_choice={"type": "function", "function": {"name": "GetWeather"}})
    ids = [_call(shoal_url, "openai", **kwargs).choices[0].message.tool_calls[0].id for _ in range(3)]
    assert len(set(ids)) == 3, ids


def test_ollama_chat_with_tools(shoal_url):
    """Ollama's API cannot force a call: the answer is text or a valid call, whichever the model picks."""
    r = _call(shoal_url, "ollama_chat", messages=[{"role": "user", "content": TOOL_PROMPT}], max_tokens=128,
              tools=[weather_tool(True)])
    message = r.choices[0].message
    if message.tool_calls:
        assert message.tool_calls[0].function.name == "GetWeather"
        check_weather_args(message.tool_calls[0].function.arguments)
    else:
        assert message.content and message.content.strip()


def test_text_completion_default_length(shoal_url):
    """OpenAI's completions without max_tokens: its documented default of 16 tokens."""
    r = litellm.text_completion(model=f"openai/{MODEL}", api_base=shoal_url + "/v1", api_key="none",
                                prompt="Once upon a time", temperature=0, timeout=TIMEOUT_S, num_retries=0)
    assert r.choices[0].text.strip()
    assert 0 < r.usage.completion_tokens <= 16


def test_embedding(shoal_url):
    r = litellm.embedding(model=f"openai/{MODEL}", api_base=shoal_url + "/v1", api_key="none",
                          input=["hello", "the weather in Paris"], timeout=TIMEOUT_S)
    vectors = [d["embedding"] for d in r.data]
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 1
    assert vectors[0] != vectors[1]
