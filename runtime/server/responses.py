"""OpenAI response bodies: whole completions, SSE chunks ending with `data: [DONE]`, usage from the cache, and
logprobs in each endpoint's own shape."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from radixcache.runtime.engine.request import GenerationResult
from radixcache.runtime.loading.detokenizer import IncrementalDetokenizer
from radixcache.runtime.server import legacy as legacy_shape
from radixcache.runtime.server.errors import api_error_for
from radixcache.runtime.server.leases import lease_usage

_FINISH = {"stop": "stop", "length": "length", "timeout": "length", "cancelled": "stop", "tool_calls": "tool_calls"}


def usage(
    prompt_tokens: int, results: Sequence[GenerationResult], n: int = 1, lease_asked: bool = False
) -> dict[str, Any]:
    """OpenAI's usage block. Each prompt counts once, as OpenAI bills n samples; its cached_tokens are the most
    any of its samples read from the radix cache (the n samples of a prompt share its pages). `results` are in
    choice order: n per prompt. `lease_asked`: the request asked for a lease (`lease` is then present)."""
    completion = sum(len(r.token_ids) for r in results)
    cached = sum(
        max(r.cached_tokens for r in results[i : i + n]) for i in range(0, len(results), n) if results[i : i + n]
    )
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    lease = lease_usage(results, lease_asked)
    if lease is not None:  # what `retain_for` got (runtime.server.leases)
        out["lease"] = lease
    return out


class Responder:
    """Builds the bodies for one request: `chat.completion` or `text_completion`. `token_bytes(id)`: the bytes one
    token stands for (for logprobs; a token may hold part of a UTF-8 character). `decode(ids)`: the text of output
    tokens as a result's text reads, after the choice's prompt of `prompts` (the legacy logprobs' `text_offset`
    counts its characters)."""

    def __init__(
        self,
        kind: str,
        model: str,
        prompt_tokens: int,
        n: int = 1,
        token_bytes: Callable[[int], bytes] = lambda t: str(t).encode(),
        legacy: legacy_shape.LegacyReply | None = None,
        calls: bool = False,
        decode: Callable[[Sequence[int]], str] | None = None,
        prompts: Sequence[Sequence[int]] = (),
        calls_only: bool = False,
    ) -> None:
        self.kind, self.model, self.prompt_tokens, self.n = kind, model, prompt_tokens, n
        self.calls_only = calls_only  # the reply is calls alone ("required", a named function): content null
        self.legacy = legacy  # set: the request used `functions`; calls are answered as `function_call`
        self.calls = calls  # the reply may be calls: a stream's first chunk says content null, as OpenAI's does
        self.token_bytes = token_bytes
        self.decode = decode or (lambda ids: b"".join(map(token_bytes, ids)).decode("utf-8", "replace"))
        self.prompts = prompts  # choice i's prompt is prompts[i // n] (none: decoded alone)
        self._texts: dict[int, IncrementalDetokenizer] = {}  # a streamed choice's text so far, for text_offset
        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    @property
    def chat(self) -> bool:
        return self.kind == "chat.completion"

    # ------------------------------------------------------------------ logprobs

    def logprobs(
        self, entries: Sequence[Any] | None, choice: int | None = None, index: int = 0
    ) -> dict[str, Any] | None:
        """`entries` (runtime.engine.request.TokenLogprob) in this endpoint's shape; None when not asked for.
        `choice`: a stream's choice whose next tokens these are (None: all the tokens of choice `index`)."""
        if entries is None:
            return None
        if self.chat:
            return {"content": [self._chat_logprob(e) for e in entries], "refusal": None}
        tokens = [self.token_text(e.token_id) for e in entries]
        # A token's text_offset is where its text begins in the choice's text, counted in the characters the
        # tokens before it completed (not in the lengths of their names: "bytes:\\xNN" is one byte of a character),
        # the same whether the tokens come whole or a few per stream chunk. A token of whole characters ends the
        # text it completes (which may also hold an earlier byte that no character took); one byte of a character
        # is at the character it belongs to.
        i = index if choice is None else choice
        prompt = self.prompts[i // self.n] if i // self.n < len(self.prompts) else ()
        text = IncrementalDetokenizer(self.decode, prompt)  # as the choice's text reads: after its prompt
        if choice is not None:
            text = self._texts.setdefault(choice, text)
        offsets = []
        for e, token in zip(entries, tokens, strict=True):
            before = text.length
            added = text.add(e.token_id)
            whole = token and not token.startswith("bytes:") and added.endswith(token)
            offsets.append(text.length - len(token) if whole else before)
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [self._top_by_text(e.top) for e in entries],
            "text_offset": offsets,
        }

    def _top_by_text(self, top: Sequence[tuple[int, float]]) -> dict[str, float]:
        """The legacy shape keys alternatives by text, and distinct tokens can share one (an id past the tokenizer's
        vocabulary decodes to ""): the most likely keeps the key (`top` runs from the most likely down)."""
        out: dict[str, float] = {}
        for token_id, logprob in top:
            out.setdefault(self.token_text(token_id), logprob)
        return out

    def token_text(self, token_id: int) -> str:
        """A token as OpenAI writes it: its text, or `bytes:\\xNN...` when it is not whole UTF-8 on its own."""
        raw = self.token_bytes(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def _chat_logprob(self, entry: Any) -> dict[str, Any]:
        def one(token_id: int, logprob: float) -> dict[str, Any]:
            return {"token": self.token_text(token_id), "logprob": logprob, "bytes": list(self.token_bytes(token_id))}

        return {**one(entry.token_id, entry.logprob), "top_logprobs": [one(t, lp) for t, lp in entry.top]}

    # ------------------------------------------------------------------ whole responses

    def _finish(self, result: GenerationResult) -> str:
        finish = _FINISH.get(result.finish_reason, "stop")
        return legacy_shape.FINISH.get(finish, finish) if self.legacy is not None else finish

    def _choice(
        self, i: int, text: str, finish: str | None, logprobs: dict[str, Any] | None, calls: Sequence[Any] = ()
    ) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": (text or None) if self.calls_only else text}
            if calls and self.legacy is not None:
                message = legacy_shape.message(text, calls)
            elif calls:  # OpenAI's shape: content null when the reply is only calls
                message = {"role": "assistant", "content": text or None, "tool_calls": [c.to_openai() for c in calls]}
            return {"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish}
        return {"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}

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

    def whole(self, results: Sequence[GenerationResult], shown: Callable[[GenerationResult], int]) -> dict[str, Any]:
        """The whole response; `shown(result)`: how many of its tokens the text shows (their logprobs are given).
        It touches no state shared with other requests (`remember` does), so a worker thread may build it."""
        choices = []
        for i, r in enumerate(results):
            lp = None if r.logprobs is None else self.logprobs(r.logprobs[: shown(r)], index=i)
            choices.append(self._choice(i, r.text, self._finish(r), lp, r.tool_calls))
        return self._envelope(self.kind, choices, usage=usage(self.prompt_tokens, results, self.n))

    def remember(self, results: Sequence[GenerationResult]) -> None:
        """A request that used `functions`: the ids of its replies' calls, for the next turn (runtime.server.legacy;
        on the event loop, which every request's legacy memory is used from)."""
        if self.legacy is not None:
            for r in results:
                self.legacy.remember(r.tool_calls)

    def empty(self, choices: int, lease_asked: bool = False, logprobs_asked: bool = False) -> dict[str, Any]:
        """max_tokens=0: no generation, an empty answer per choice (and no lease held); asked for logprobs, each
        choice's are those of no token (empty lists, as a reply of only a stop token has), not null."""
        return self._envelope(
            self.kind,
            [
                self._choice(i, "", "length", self.logprobs([], index=i) if logprobs_asked else None)
                for i in range(choices)
            ],
            usage=usage(self.prompt_tokens, [], lease_asked=lease_asked),
        )

    # ------------------------------------------------------------------ streams

    def empty_stream(self, choices: int, include_usage: bool, lease_asked: bool = False) -> list[str]:
        """max_tokens=0 asked as a stream: still an SSE stream (a client reading one parses nothing else), each
        choice's role chunk (chat) and "length" finish chunk, the usage chunk when asked for, then `data: [DONE]`."""
        events = []
        for i in range(choices):
            if self.chat:
                events.append(_sse(self._chunk(i, None, None, first=True)))
            events.append(_sse(self._chunk(i, None if self.chat else "", "length")))
        if include_usage:
            kind = self._chunk(0, None, None)["object"]
            events.append(_sse(self._envelope(kind, [], usage=usage(self.prompt_tokens, [], lease_asked=lease_asked))))
        return [*events, "data: [DONE]\n\n"]

    def _chunk(
        self,
        i: int,
        text: str | None,
        finish: str | None,
        first: bool = False,
        logprobs: dict[str, Any] | None = None,
        delta: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if self.chat:
            if delta is None:
                delta = {"role": "assistant", "content": None if self.calls else ""} if first else {}
                if text is not None:
                    delta["content"] = text
            choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", [choice])
        return self._envelope(
            "text_completion", [{"index": i, "text": text or "", "logprobs": logprobs, "finish_reason": finish}]
        )

    async def sse(
        self,
        events: AsyncIterator[Any],
        include_usage: bool,
        metrics: Any,
        want_logprobs: bool = False,
        namespace: Any = None,
    ) -> AsyncIterator[str]:
        """The SSE stream: a role chunk per choice (chat) at its first token, content deltas (with the logprobs of
        their tokens when asked for), a finish chunk per choice, the usage chunk when asked for, then
        `data: [DONE]`. With tools, the deltas are OpenAI's tool-call deltas (`_deltas`). A failure mid-stream (building
        the usage chunk included) sends OpenAI's error object as an event, then `data: [DONE]`."""
        results: dict[int, GenerationResult] = {}
        started: set[int] = set()
        last = None  # the usage chunk, built inside the error handling: one that fails is an error event too
        try:
            try:
                async for event in events:
                    i = event.index
                    if self.chat and i not in started:
                        started.add(i)
                        yield _sse(self._chunk(i, None, None, first=True))
                    lp = None
                    if want_logprobs and event.logprobs:
                        lp = self.logprobs(event.logprobs, i)
                    if event.deltas is not None:
                        for chunk in self._deltas(i, event.deltas, lp):
                            yield _sse(chunk)
                    elif event.text or lp is not None:
                        yield _sse(self._chunk(i, event.text, None, logprobs=lp))
                    if event.result is not None:
                        results[i] = event.result
                        metrics.observe(event.result, namespace)
                        finish = self._finish(event.result)
                        if self.legacy is not None:
                            self.legacy.remember(event.result.tool_calls)
                        yield _sse(self._chunk(i, None if self.chat else "", finish))
            finally:
                await events.aclose()  # type: ignore[attr-defined]
            if include_usage:
                ordered = [results[i] for i in sorted(results)]
                kind = self._chunk(0, None, None)["object"]
                last = _sse(self._envelope(kind, [], usage=usage(self.prompt_tokens, ordered, self.n)))
        except Exception as exc:  # the headers are sent: the error travels in the stream, which still ends well
            error = api_error_for(exc)
            metrics.failed(error.status)
            yield _sse(error.body())
            yield "data: [DONE]\n\n"
            return
        if last is not None:
            yield last
        metrics.requests_ok += 1
        yield "data: [DONE]\n\n"

    def _deltas(self, i: int, deltas: Sequence[dict[str, Any]], lp: dict[str, Any] | None) -> list[dict[str, Any]]:
        """A chat with tools: one chunk per delta of the parser, as OpenAI streams calls: `{"content": text}`, then
        per call `{"tool_calls": [{"index", "id", "type": "function", "function": {"name", "arguments": ""}}]}` and
        `{"tool_calls": [{"index", "function": {"arguments": piece}}]}`. The logprobs of the event's tokens ride on
        its first chunk (an empty delta when the tokens completed none: a call's text held back to decide)."""
        if self.legacy is not None:  # the deprecated shape: the first call as function_call deltas
            deltas = [d for d in map(legacy_shape.delta, deltas) if d is not None]
        if not deltas:
            return [] if lp is None else [self._chunk(i, None, None, logprobs=lp, delta={})]
        return [self._chunk(i, None, None, logprobs=lp if j == 0 else None, delta=d) for j, d in enumerate(deltas)]


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
