"""In-flight sharing through the OpenAI server: requests that share a long system prompt and arrive while the
first one is still generating report the prompt's pages as cached (before, they reported 0 until the first
request finished)."""

from __future__ import annotations

import threading
import time

SYSTEM = "You share one long system prompt with three later callers, who arrive while you still talk. " * 3


def _messages(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def test_requests_arriving_while_the_first_streams_hit_its_system_prompt(client) -> None:
    first_chunk = threading.Event()
    done: dict[str, float] = {}
    usage: dict[str, object] = {}

    def first() -> None:
        stream = client.chat.completions.create(
            model="tiny",
            messages=_messages("go on at length"),
            temperature=0,
            max_tokens=160,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            first_chunk.set()
            if chunk.usage is not None:
                usage["first"] = chunk.usage
        done["first"] = time.monotonic()

    t = threading.Thread(target=first)
    t.start()
    assert first_chunk.wait(60)
    sent_at = time.monotonic()
    later = [
        client.chat.completions.create(model="tiny", messages=_messages(f"q{i}"), temperature=0, max_tokens=4)
        for i in range(3)
    ]
    t.join(60)
    first_usage = usage["first"]
    assert first_usage.completion_tokens > 100, "the first request must generate long enough to overlap"  # type: ignore[attr-defined]
    assert sent_at < done["first"], "the later requests were sent while the first still streamed"
    assert first_usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[attr-defined]
    for r in later:
        shared = r.usage.prompt_tokens - 16  # all but the differing user turn and the last partial page
        assert r.usage.prompt_tokens_details.cached_tokens >= shared - 16, r.usage
