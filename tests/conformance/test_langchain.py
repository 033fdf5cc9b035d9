"""LangChain's ChatOpenAI, ChatAnthropic and ChatOllama against a real shoal: `invoke`, `stream`,
`bind_tools` (forced where the API can force a call) and `with_structured_output`."""

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_ollama import ChatOllama
from langchain_openai import ChatOpenAI

from conftest import MODEL
from tools import PROMPT, STRUCTURED_PROMPT, TOOL_PROMPT, GetWeather, Person, check_weather_args

MAX_TOKENS = 64
TIMEOUT_S = 120


def _chat(cls, shoal_url):
    if cls is ChatOpenAI:
        return ChatOpenAI(model=MODEL, base_url=shoal_url + "/v1", api_key="none", temperature=0,
                          max_tokens=MAX_TOKENS, max_retries=0, timeout=TIMEOUT_S)
    if cls is ChatAnthropic:
        return ChatAnthropic(model=MODEL, base_url=shoal_url, api_key="none", temperature=0,
                             max_tokens=MAX_TOKENS, max_retries=0, timeout=TIMEOUT_S)
    return ChatOllama(model=MODEL, base_url=shoal_url, temperature=0, num_predict=MAX_TOKENS,
                      client_kwargs={"timeout": TIMEOUT_S})


CLASSES = [ChatOpenAI, ChatAnthropic, ChatOllama]
IDS = [c.__name__ for c in CLASSES]


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_invoke(shoal_url, cls):
    message = _chat(cls, shoal_url).invoke(PROMPT)
    assert isinstance(message.content, str) and message.content.strip()
    assert 0 < message.usage_metadata["output_tokens"] <= MAX_TOKENS


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_stream(shoal_url, cls):
    chunks = list(_chat(cls, shoal_url).stream(PROMPT))
    text = "".join(c.content for c in chunks if isinstance(c.content, str))
    assert len(chunks) > 1 and text.strip()


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
@pytest.mark.parametrize("cls", [ChatOpenAI, ChatAnthropic], ids=["ChatOpenAI", "ChatAnthropic"])
def test_bind_tools_forced(shoal_url, cls, strict):
    """A forced call, as written in LangChain (`strict=True`: the closed schema of OpenAI's strict mode)."""
    llm = _chat(cls, shoal_url).bind_tools([GetWeather], tool_choice="GetWeather",
                                          **({"strict": True} if strict else {}))
    message = llm.invoke(TOOL_PROMPT)
    assert not message.invalid_tool_calls, f"cut-off or malformed call: {message.invalid_tool_calls}"
    assert len(message.tool_calls) == 1, f"no tool call: {message}"
    call = message.tool_calls[0]
    assert call["name"] == "GetWeather" and call["id"]
    check_weather_args(call["args"])


@pytest.mark.parametrize("cls", [ChatOpenAI, ChatAnthropic], ids=["ChatOpenAI", "ChatAnthropic"])
def test_bind_tools_forced_stream(shoal_url, cls):
    """The forced call streamed: LangChain's tool-call chunks add up to one valid call."""
    llm = _chat(cls, shoal_url).bind_tools([GetWeather], tool_choice="GetWeather", strict=True)
    chunks = list(llm.stream(TOOL_PROMPT))
    message = chunks[0]
    for chunk in chunks[1:]:
        message = message + chunk
    assert not message.invalid_tool_calls, message.invalid_tool_calls
    assert len(message.tool_calls) == 1, f"no tool call in {len(chunks)} chunks: {message}"
    assert message.tool_calls[0]["name"] == "GetWeather"
    check_weather_args(message.tool_calls[0]["args"])


def test_bind_tools_ollama(shoal_url):
    """Ollama's API cannot force a call: the answer is text or a valid call, whichever the model picks."""
    message = _chat(ChatOllama, shoal_url).bind_tools([GetWeather]).invoke(TOOL_PROMPT)
    assert not message.invalid_tool_calls, message.invalid_tool_calls
    if message.tool_calls:
        assert message.tool_calls[0]["name"] == "GetWeather"
        check_weather_args(message.tool_calls[0]["args"])
    else:
        assert message.content.strip()


@pytest.mark.parametrize("cls", CLASSES, ids=IDS)
def test_with_structured_output(shoal_url, cls):
    result = _chat(cls, shoal_url).with_structured_output(Person, include_raw=True).invoke(STRUCTURED_PROMPT)
    assert result["parsing_error"] is None, result
    person = result["parsed"]
    assert isinstance(person, Person)
    assert person.name.strip()
    raw = result["raw"].content
    if isinstance(raw, str) and raw:  # the JSON as shoal wrote it (ChatAnthropic's comes as a tool call)
        assert "\n" not in raw and "  " not in raw, f"whitespace runs in constrained JSON: {raw!r}"
