"""The asyncio side of the engine: awaiting handles without blocking the event loop, and a request's text deltas
as its tokens come (Engine.agenerate and Engine.stream are thin fronts over these).

Tokens reach the stream through the request's listener, called on the engine loop thread, and cross to the event
loop with `call_soon_threadsafe`. The deltas' concatenation is the result's text: stop tokens are not shown, and
text that could begin a stop string is held back until it cannot. With tools, `tool_deltas` turns the text deltas
into OpenAI's delta dicts (runtime.tools.ToolCallParser), which assemble to the result's content and calls.
`TextStream` is what `Engine.stream` hands its reader: the deltas, then the result (and so why the stream ended).

Tokenising, rendering a chat template and compiling a grammar take milliseconds to a second (a schema of 400
properties: ~40 ms): `off_loop` runs them on a worker thread, so that the caller's event loop keeps serving its
other coroutines meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from radixcache.runtime.engine.loop import RequestHandle
from radixcache.runtime.engine.output import OutputProcessor
from radixcache.runtime.engine.request import GenerationResult, Request
from radixcache.runtime.engine.sampling import stop_token_set
from radixcache.runtime.engine.tool_calls import tool_parser
from radixcache.runtime.tools import ToolCallParser

T = TypeVar("T")


class TextStream:
    """What `Engine.stream` returns: an async iterator of the deltas (`async for delta in engine.stream(...)`).

    Once it has ended, `result` is the request's GenerationResult (None before, and when the reader left early)
    and `finish_reason` its finish_reason, which says why the stream ended as `generate`'s results do: "stop",
    "length" or "tool_calls" when it finished; "cancelled" when it was cut (Engine.close, or its handle
    cancelled); "timeout" when its `timeout` ran out. A refused or failed request raises its error instead.
    `aclose()` (or leaving an `async with contextlib.aclosing(...)`) cancels the request, and so does letting go of
    the stream: a reader that breaks out of `async for delta in engine.stream(...)` cancels it as the iterator is
    freed (the deltas' generator holds a list of the result, not the stream: a cycle between them left the request
    decoding until a full garbage collection, or the event loop's end, closed it)."""

    def __init__(self, open_deltas: Callable[[Callable[[GenerationResult], None]], AsyncIterator[Any]]) -> None:
        self._results: list[GenerationResult] = []
        self._deltas = open_deltas(self._results.append)

    @property
    def result(self) -> GenerationResult | None:
        return self._results[-1] if self._results else None

    @property
    def finish_reason(self) -> str | None:
        return None if self.result is None else self.result.finish_reason

    def __aiter__(self) -> TextStream:
        return self

    async def __anext__(self) -> Any:
        return await self._deltas.__anext__()

    async def aclose(self) -> None:
        await self._deltas.aclose()  # type: ignore[attr-defined]


async def off_loop(work: Callable[[], T], undo: Callable[[T], None] | None = None) -> T:
    """`work()` on a worker thread (the event loop's default executor, in the caller's context), awaited without
    blocking the event loop; its error raises here. If the awaiting task is cancelled before it ends, `undo` is
    given what `work` returns (say its requests, to cancel them), whichever side comes second."""
    loop = asyncio.get_running_loop()
    lock = threading.Lock()
    state: list[Any] = []  # ["abandoned"] by the awaiter, or ["returned", value] by the worker: the first wins

    def run() -> T:
        value = work()
        with lock:
            if state:  # the awaiter was cancelled meanwhile: nobody takes the value
                if undo is not None:
                    undo(value)
            else:
                state.extend(("returned", value))
        return value

    future = loop.run_in_executor(None, contextvars.copy_context().run, run)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with lock:
            returned = bool(state)
            if not returned:
                state.append("abandoned")
        if returned and undo is not None:
            undo(state[1])
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # an error nobody awaits is not logged
        raise


def held_back_length(length: int, stop: Sequence[str]) -> int:
    """How much of a text of `length` characters is safe to show: all but its last `len(longest stop) - 1`, which
    may still begin a stop string (none of it while it is shorter than that)."""
    holdback = max((len(s) for s in stop), default=1) - 1
    return max(0, length - holdback)


async def submitted_results(submit: Callable[[], Any]) -> Any:
    """The result of `submit()`'s handle (or the results of its list of handles), awaited; `submit` runs off the
    event loop (`off_loop`: it tokenises, compiles grammars), and a cancelled awaiter cancels its requests."""
    handles = await off_loop(submit, lambda h: [x.cancel() for x in (h if isinstance(h, list) else [h])])
    single = isinstance(handles, RequestHandle)
    results = await gather_results([handles] if single else handles)
    return results[0] if single else results


async def request_deltas(
    build: Callable[[], Request],
    enqueue: Callable[[list[Request]], list[RequestHandle]],
    output: OutputProcessor,
    ended: Callable[[GenerationResult], None] | None = None,
) -> AsyncIterator[Any]:
    """Engine.stream's deltas: the request `build()` makes (off the event loop), queued with `enqueue`, as text
    (`stream_text`) or, for a chat with tools, OpenAI's delta dicts (`tool_deltas`). `ended`: as stream_text's."""
    req = await off_loop(build)
    deltas: AsyncIterator[Any] = stream_text(req, enqueue, output, output.eos_token_ids, ended)
    if req.tool_use is not None and req.call_ids is not None:
        deltas = tool_deltas(deltas, tool_parser(req.tool_use, output.tool_features.format, req.call_ids))
    async with contextlib.aclosing(deltas):  # type: ignore[type-var]
        async for delta in deltas:
            yield delta


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
    ended: Callable[[GenerationResult], None] | None = None,
) -> AsyncIterator[str]:
    """Queue `req` with `enqueue` and yield its text deltas; `ended` is given its result before the last delta. A
    request that is refused (say a prompt larger than the pool) or fails raises its error here, as does a loop
    thread that died. Closing the iterator (or cancelling the task reading it) cancels the request."""
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
    detok = output.detokenizer(req.prompt_ids, output.kept(req))  # as the result's text: its call tokens shown
    handle = enqueue([req])[0]
    # The future also ends when no listener call ever comes (a refused request, a dead loop): wake the reader.
    handle.future.add_done_callback(lambda _: _call_soon(loop, queue.put_nowait, ((), True)))
    emitted = 0  # characters yielded: the detokenizer's text up to there (read by its end, O(1) a token)
    try:
        while True:
            tokens, done = await queue.get()
            if done:  # the rest comes from the result's text (cut at a stop string); an error raises here
                break
            for t in tokens:
                if t not in hidden:
                    detok.add(t)
            visible = held_back_length(detok.length, params.stop)
            if visible > emitted:
                yield detok.since(emitted)[: visible - emitted]
                emitted = visible
        result = await asyncio.wrap_future(handle.future)  # an error raises here
        if ended is not None:
            ended(result)
        text = output.raw_text(req)  # the result's text before any tool calls were parsed out of it
        if len(text) > emitted and text.startswith(detok.text[:emitted]):
            yield text[emitted:]
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
