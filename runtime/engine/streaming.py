"""The asyncio side of the engine: awaiting handles without blocking the event loop, and a request's text deltas
as its tokens come (Engine.agenerate and Engine.stream are thin fronts over these).

Tokens reach the stream through the request's listener, called on the engine loop thread, and cross to the event
loop with `call_soon_threadsafe`. The deltas' concatenation is the result's text: stop tokens are not shown, and
text that could begin a stop string is held back until it cannot. With tools, `tool_deltas` turns the text deltas
into OpenAI's delta dicts (runtime.tools.ToolCallParser), which assemble to the result's content and calls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from radixcache.runtime.engine.loop import RequestHandle
from radixcache.runtime.engine.output import OutputProcessor
from radixcache.runtime.engine.request import GenerationResult, Request
from radixcache.runtime.engine.sampling import stop_token_set
from radixcache.runtime.tools import ToolCallParser


def held_back(text: str, stop: Sequence[str]) -> str:
    """`text` short of its last `len(longest stop) - 1` characters, which may still begin a stop string (all of it
    is held back while it is shorter than that: a negative end would show all but its last characters)."""
    holdback = max((len(s) for s in stop), default=1) - 1
    return text[: max(0, len(text) - holdback)]


async def gather_results(handles: list[RequestHandle]) -> list[GenerationResult]:
    """Every handle's result, awaited on the event loop; cancelling the awaiting task cancels every request."""
    try:
        return list(await asyncio.gather(*(asyncio.wrap_future(h.future) for h in handles)))
    except BaseException:
        for h in handles:
            h.cancel()
        raise


async def stream_text(
    req: Request,
    enqueue: Callable[[list[Request]], list[RequestHandle]],
    output: OutputProcessor,
    eos_token_ids: Sequence[int],
) -> AsyncIterator[str]:
    """Queue `req` with `enqueue` and yield its text deltas. A request that is refused (say a prompt larger than
    the pool) or fails raises its error here, as does a loop thread that died. Closing the iterator (or cancelling
    the task reading it) cancels the request."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[tuple[int, ...], bool]] = asyncio.Queue()
    sent = 0

    def listener(r: Request) -> None:  # on the engine loop thread
        nonlocal sent
        new = tuple(r.output_ids[sent:])
        sent = len(r.output_ids)
        loop.call_soon_threadsafe(queue.put_nowait, (new, r.finished or r.error is not None))

    req.listener = listener
    params = req.sampler.params
    hidden = stop_token_set(params, eos_token_ids)
    detok = output.detokenizer()
    handle = enqueue([req])[0]
    # The future also ends when no listener call ever comes (a refused request, a dead loop): wake the reader.
    handle.future.add_done_callback(lambda _: _call_soon(loop, queue.put_nowait, ((), True)))
    emitted = ""
    try:
        while True:
            tokens, done = await queue.get()
            if done:  # the rest comes from the result's text (cut at a stop string); an error raises here
                break
            for t in tokens:
                if t not in hidden:
                    detok.add(t)
            visible = held_back(detok.text, params.stop)
            if len(visible) > len(emitted):
                yield visible[len(emitted) :]
                emitted = visible
        await asyncio.wrap_future(handle.future)  # an error raises here
        text = output.raw_text(req)  # the result's text before any tool calls were parsed out of it
        if text.startswith(emitted) and len(text) > len(emitted):
            yield text[len(emitted) :]
    finally:
        # Also when this generator's task was cancelled: that cancels the future (so it reads as done)
        # but not the engine request. Cancelling a request that already left is a no-op.
        if not handle.done() or handle.future.cancelled():
            handle.cancel()


async def tool_deltas(texts: AsyncIterator[str], parser: ToolCallParser) -> AsyncIterator[dict[str, Any]]:
    """OpenAI's streamed deltas of a chat with tools: `{"content": text}`, then per call `{"tool_calls": [{"index",
    "id", "type": "function", "function": {"name", "arguments": ""}}]}` and `{"tool_calls": [{"index", "function":
    {"arguments": piece}}]}` as the arguments arrive (runtime.tools.parse). Closing it closes `texts` (and so
    cancels the request)."""
    async with contextlib.aclosing(texts):  # type: ignore[type-var]
        async for text in texts:
            for delta in parser.feed(text):
                yield delta
        for delta in parser.finish():
            yield delta


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    """`loop.call_soon_threadsafe` that ignores a loop already closed (the reader went away)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)
