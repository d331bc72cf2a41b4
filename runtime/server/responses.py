"""OpenAI response bodies: whole completions, SSE chunks ending with `data: [DONE]`, and usage from the cache."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from radixcache.runtime.engine.request import GenerationResult

_FINISH = {"stop": "stop", "length": "length", "timeout": "length", "cancelled": "stop"}


def usage(prompt_tokens: int, results: Sequence[GenerationResult]) -> dict[str, Any]:
    """OpenAI's usage block. The prompt counts once, as OpenAI bills n samples; cached_tokens is the most any
    sample read from the radix cache (with n > 1 they share the prompt's pages)."""
    completion = sum(len(r.token_ids) for r in results)
    cached = max((r.cached_tokens for r in results), default=0)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


class Responder:
    """Builds the bodies for one request: `chat.completion` or `text_completion`."""

    def __init__(self, kind: str, model: str, prompt_tokens: int) -> None:
        self.kind, self.model, self.prompt_tokens = kind, model, prompt_tokens
        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    @property
    def chat(self) -> bool:
        return self.kind == "chat.completion"

    def _choice(self, i: int, text: str, finish: str | None) -> dict[str, Any]:
        if self.chat:
            return {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        return {"index": i, "text": text, "logprobs": None, "finish_reason": finish}

    def _envelope(self, kind: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "system_fingerprint": None,
            **extra,
        }

    def whole(self, results: Sequence[GenerationResult]) -> dict[str, Any]:
        choices = [self._choice(i, r.text, _FINISH.get(r.finish_reason, "stop")) for i, r in enumerate(results)]
        return self._envelope(self.kind, choices, usage=usage(self.prompt_tokens, results))

    def empty(self, job: Any) -> dict[str, Any]:
        """max_tokens=0: no generation, an empty answer per sample."""
        choices = [self._choice(i, "", "length") for i in range(job.n)]
        return self._envelope(self.kind, choices, usage=usage(self.prompt_tokens, []))

    def _chunk(self, i: int, text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", [choice])
        return self._envelope(
            "text_completion", [{"index": i, "text": text or "", "logprobs": None, "finish_reason": finish}]
        )

    async def sse(self, events: AsyncIterator[Any], include_usage: bool, metrics: Any) -> AsyncIterator[str]:
        """The SSE stream: a role chunk per sample (chat), content deltas, a finish chunk per sample, the usage
        chunk when asked for, then `data: [DONE]`. An error mid-stream is sent as an error event."""
        results: dict[int, GenerationResult] = {}
        started: set[int] = set()
        try:
            async for i, delta, result in events:
                if self.chat and i not in started:
                    started.add(i)
                    yield _sse(self._chunk(i, None, None, first=True))
                if delta:
                    yield _sse(self._chunk(i, delta, None))
                if result is not None:
                    results[i] = result
                    metrics.observe(result)
                    yield _sse(self._chunk(i, None if self.chat else "", _FINISH.get(result.finish_reason, "stop")))
        except (ValueError, RuntimeError) as exc:
            metrics.requests_failed += 1
            yield _sse({"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}})
            yield "data: [DONE]\n\n"
            return
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        if include_usage:
            ordered = [results[i] for i in sorted(results)]
            yield _sse(
                self._envelope(self._chunk(0, None, None)["object"], [], usage=usage(self.prompt_tokens, ordered))
            )
        metrics.requests_ok += 1
        yield "data: [DONE]\n\n"


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
