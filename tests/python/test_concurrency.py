"""100 concurrent streaming chat requests through the official `openai` SDK (AsyncOpenAI).

Each request has its own seed, so its sampled text is a function of (prompt, seed) alone: run alone first
(sequentially), then all 100 at once. The engine admits 64 sequences and queues the rest, so this covers
batching, queueing and per-request token routing: every stream must finish, and each must carry exactly
its own alone-run text (no token lost, duplicated or sent to the wrong stream).
"""

import asyncio

import openai

MODEL_ID = "smollm2-135m-instruct-q4_1"

N_REQUESTS = 100
MAX_TOKENS = 12
PER_REQUEST_TIMEOUT_S = 120
OVERALL_TIMEOUT_S = 300
# Requests that also ask for the usage chunk.
WITH_USAGE = set(range(0, N_REQUESTS, 17))

PROMPTS = [
    "Name three colors.",
    "Write a short poem about the moon.",
    "What is the capital of France?",
    "Give me a fun fact about octopuses.",
    "Describe a sunny day in one sentence.",
    "List some fruits.",
]


def _params(i: int) -> dict:
    return {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        "temperature": 0.8,
        "top_p": 0.95,
        "max_tokens": MAX_TOKENS,
        "seed": 1000 + i,
    }


async def _alone(client: openai.AsyncOpenAI, i: int):
    resp = await client.chat.completions.create(**_params(i))
    choice = resp.choices[0]
    assert choice.finish_reason in ("stop", "length"), choice.finish_reason
    return choice.message.content, choice.finish_reason, resp.usage


async def _streamed(client: openai.AsyncOpenAI, i: int):
    kwargs = _params(i)
    if i in WITH_USAGE:
        kwargs["stream_options"] = {"include_usage": True}
    stream = await client.chat.completions.create(**kwargs, stream=True)
    pieces, finish, usage, ids = [], [], None, set()
    async for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert len(ids) == 1, f"request {i}: chunks with different ids {ids}"
    return "".join(pieces), finish, usage


async def _run(server_url: str):
    client = openai.AsyncOpenAI(
        base_url=f"{server_url}/v1", api_key="not-needed", max_retries=0, timeout=PER_REQUEST_TIMEOUT_S
    )
    try:
        expected = [await _alone(client, i) for i in range(N_REQUESTS)]
        results = await asyncio.gather(*(_streamed(client, i) for i in range(N_REQUESTS)), return_exceptions=True)
    finally:
        await client.close()
    return expected, results


def test_100_concurrent_streams_match_their_alone_runs(server_url):
    expected, results = asyncio.run(asyncio.wait_for(_run(server_url), OVERALL_TIMEOUT_S))

    failures = [f"request {i}: {r!r}" for i, r in enumerate(results) if isinstance(r, BaseException)]
    assert not failures, "streams failed:\n" + "\n".join(failures)

    # Seeds must matter, or this test would not tell crossed streams apart.
    assert len({text for text, _, _ in expected}) > len(PROMPTS), "seeded sampling looks deterministic"

    mismatches = []
    for i, ((want_text, want_finish, want_usage), (text, finish, usage)) in enumerate(zip(expected, results)):
        if finish != [want_finish]:
            mismatches.append(f"request {i}: finish_reason {finish}, alone {want_finish!r}")
        if text != want_text:
            mismatches.append(f"request {i}: streamed {text!r} != alone {want_text!r}")
        if i in WITH_USAGE:
            if usage is None:
                mismatches.append(f"request {i}: no usage chunk despite include_usage")
            elif (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) != (
                want_usage.prompt_tokens,
                want_usage.completion_tokens,
                want_usage.prompt_tokens + want_usage.completion_tokens,
            ):
                mismatches.append(f"request {i}: usage {usage} != alone {want_usage}")
        elif usage is not None:
            mismatches.append(f"request {i}: usage chunk without include_usage")
    assert not mismatches, f"{len(mismatches)} problems:\n" + "\n".join(mismatches)

    # And the alone runs' own usage is consistent.
    for _, finish, usage in expected:
        assert usage.completion_tokens <= MAX_TOKENS
        assert finish != "length" or usage.completion_tokens == MAX_TOKENS
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
