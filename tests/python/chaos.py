"""Chaos under load, the client side (issue 30): concurrent greedy streams against one node's API, each
recorded with its tokens, how it ended and when its tokens came, and the judge that holds every request
to its lone run. Imported by `test_chaos.py`; also run as a program inside a network-lab namespace (the
lab is not reachable from the host's), where it prints its results as JSON:

    python3 chaos.py streams URL MAX_TOKENS K...      one stream per K at once; prints "started", then the results
    python3 chaos.py probe URL MAX_TOKENS TOKENS_JSON SECONDS
                                                      streams prompt 0 until it gives TOKENS; prints the wall
                                                      clock time it did (or fails after SECONDS)

Only the standard library and `openai`: no pytest, so it runs wherever python3 does."""

import concurrent.futures
import json
import sys
import threading
import time

import openai

MODEL_ID = "smollm2-135m-instruct-q4_1"
# No request may outlive this (a fault lasts seconds; a stream waits at most 10 s for its instance).
REQUEST_DEADLINE_S = 90


def prompt(k: int) -> str:
    return f"Tell me a short story about the number {k}."


def stream_one(url: str, k: int, max_tokens: int, extra: "dict | None" = None, text: "str | None" = None,
               first=None) -> dict:
    """One streamed greedy request (prompt `k`, or `text`): its tokens, the wall-clock time of each chunk
    that carried tokens, its finish reason or error, and how long it took. `first` (a threading.Event)
    is set at its first token or its end."""
    started = time.monotonic()
    tokens, at, finish, error = [], [], None, None
    try:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=REQUEST_DEADLINE_S)
        s = c.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": text or prompt(k)}], max_tokens=max_tokens,
            temperature=0, stream=True, logprobs=True, extra_body=extra or None,
        )
        for chunk in s:
            if not chunk.choices:
                continue
            ch = chunk.choices[0]
            if ch.logprobs and ch.logprobs.content:
                got = [t.token for t in ch.logprobs.content]
                tokens += got
                at += [time.time()] * len(got)
                if first:
                    first.set()
            if ch.finish_reason:
                finish = ch.finish_reason
    except (openai.APIError, openai.APIConnectionError) as e:
        status = getattr(e, "status_code", None)
        error = (f"{status}: " if status else "") + (str(e) or type(e).__name__)
    if first:
        first.set()
    return {"k": k, "tokens": tokens, "at": at, "finish": finish, "error": error,
            "s": time.monotonic() - started}


def streams(url: str, ks, max_tokens: int, started=None) -> "list[dict]":
    """One stream per k, all at once; `started()` is called once every one has its first token (so a
    fault lands mid-stream), or after 30 s."""
    ks = list(ks)
    firsts = [threading.Event() for _ in ks]
    with concurrent.futures.ThreadPoolExecutor(len(ks)) as pool:
        futures = [pool.submit(stream_one, url, k, max_tokens, first=e) for k, e in zip(ks, firsts)]
        deadline = time.monotonic() + 30
        for e in firsts:
            e.wait(max(0.0, deadline - time.monotonic()))
        if started:
            started()
        return [f.result(timeout=REQUEST_DEADLINE_S + 30) for f in futures]


def probe(url: str, max_tokens: int, want: "list[str]", seconds: float) -> float:
    """The wall-clock time at which a stream of prompt 0 first gave `want` (polling from now)."""
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        last = stream_one(url, 0, max_tokens)
        if last["error"] is None and last["tokens"] == want:
            return time.time()
        time.sleep(0.05)
    raise TimeoutError(f"not served again within {seconds} s (last: {last!r})")


def judge(results, alone, what: str, fault_at: "float | None" = None) -> dict:
    """Holds every request to its lone run and counts: requests, completed (exactly the lone run's tokens
    with a finish reason: never silently truncated), continued (completed with tokens on both sides of
    `fault_at`, a wall-clock time: the stream went through the fault), errored (a clear error, after a
    prefix of the lone run's tokens), the seconds after `fault_at` until every stream it cut had tokens
    flowing again, the longest pause any stream saw, and the distinct errors."""
    counts = {"requests": len(results), "completed": 0, "continued": 0, "errored": 0}
    for r in results:
        assert r["s"] < REQUEST_DEADLINE_S, f"{what}: request {r['k']} took {r['s']:.0f} s"
        if r["error"] is None:
            assert r["finish"] in ("stop", "length"), (what, r)
            assert r["tokens"] == alone[r["k"]], f"{what}: request {r['k']} differs from its lone run: {r}"
            counts["completed"] += 1
            if fault_at is not None and r["at"] and r["at"][0] < fault_at < r["at"][-1]:
                counts["continued"] += 1
        else:
            assert r["error"].strip(), (what, r)
            assert r["tokens"] == alone[r["k"]][: len(r["tokens"])], f"{what}: wrong tokens before the error: {r}"
            counts["errored"] += 1
    if fault_at is not None:
        # How long after the fault every stream it cut had tokens flowing again: the cluster serving.
        again = [next(t for t in r["at"] if t > fault_at) - fault_at
                 for r in results if r["at"] and r["at"][0] < fault_at < r["at"][-1]]
        if again:
            counts["flowing_again_s"] = round(max(again), 1)
    gaps = [b - a for r in results for a, b in zip(r["at"], r["at"][1:])]
    if gaps:
        # The longest a client waited between two tokens: the pause the fault cost a stream.
        counts["longest_pause_s"] = round(max(gaps), 1)
    errors = sorted({r["error"][:120] for r in results if r["error"]})
    if errors:
        counts["errors"] = errors
    return counts


def main(argv) -> None:
    if argv[:1] == ["streams"]:
        url, max_tokens, ks = argv[1], int(argv[2]), [int(k) for k in argv[3:]]
        out = streams(url, ks, max_tokens, started=lambda: print("started", flush=True))
        print(json.dumps(out), flush=True)
    elif argv[:1] == ["probe"]:
        url, max_tokens, want, seconds = argv[1], int(argv[2]), json.loads(argv[3]), float(argv[4])
        print(json.dumps(probe(url, max_tokens, want, seconds)), flush=True)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
