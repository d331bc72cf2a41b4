"""Run OpenAI-style requests on the Engine from asyncio: whole results, or text deltas then the result.

Every engine request is tracked in `Inflight`, so that a client that goes away, or the server shutting down,
cancels it (the engine frees its blocks at its next step).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixcache.runtime.engine.loop import RequestHandle
from radixcache.runtime.engine.request import GenerationResult

Event = tuple[int, str | None, GenerationResult | None]  # (choice index, text delta, final result)


@dataclass(slots=True)
class Inflight:
    """The handles of every engine request the server has running."""

    handles: set[RequestHandle] = field(default_factory=set)
    cancelled: int = 0  # engine requests this server aborted (client gone, shutdown)

    def cancel(self, handle: RequestHandle) -> None:
        if not handle.done():
            self.cancelled += 1
            handle.cancel()

    def cancel_all(self) -> int:
        live = [h for h in list(self.handles) if not h.done()]
        for h in live:
            self.cancel(h)
        return len(live)


@dataclass(frozen=True, slots=True)
class Job:
    """One HTTP request's generation: a tokenised prompt, n samples, the engine arguments."""

    prompt_ids: list[int]
    n: int
    max_tokens: int
    kwargs: dict[str, Any]  # temperature, top_p, seed, stop, namespace

    def sample_kwargs(self, i: int) -> dict[str, Any]:
        kw = dict(self.kwargs)
        if kw.get("seed") is not None:
            kw["seed"] = kw["seed"] + i
        return kw


async def result_of(handle: RequestHandle) -> GenerationResult:
    """Await a handle's result. Unlike `asyncio.wrap_future`, cancelling the awaiting task leaves the handle's
    future alone: a cancelled concurrent future would make the engine loop fail when it delivers the result,
    and would hide from `Inflight.cancel` that the engine request still runs."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[GenerationResult] = loop.create_future()

    def copy(f: Any) -> None:
        if waiter.done():
            return
        if f.cancelled():
            waiter.cancel()
        elif f.exception() is not None:
            waiter.set_exception(f.exception())
        else:
            waiter.set_result(f.result())

    handle.future.add_done_callback(lambda f: loop.call_soon_threadsafe(copy, f))
    return await waiter


def _submit_all(engine: Any, job: Job, inflight: Inflight) -> list[RequestHandle]:
    """The job's n samples as one group (Engine.submit_group): they share the prompt's KV in flight, and none
    counts another's prefill of it as cached."""
    if job.n == 1:
        handles = [engine.submit(job.prompt_ids, job.max_tokens, **job.sample_kwargs(0))]
    else:
        each = [job.sample_kwargs(i) for i in range(job.n)]
        handles = engine.submit_group([job.prompt_ids] * job.n, job.max_tokens, each=each)
    for handle in handles:
        inflight.handles.add(handle)
        handle.future.add_done_callback(lambda _, h=handle: inflight.handles.discard(h))
    return handles


async def complete(engine: Any, job: Job, inflight: Inflight) -> list[GenerationResult]:
    """The n results of a job; cancelling the awaiting task cancels every engine request."""
    handles = _submit_all(engine, job, inflight)
    try:
        return list(await asyncio.gather(*(result_of(h) for h in handles)))
    finally:
        for h in handles:
            inflight.cancel(h)


def _visible_text(engine: Any, ids: Sequence[int], hidden: set[int], stop: Sequence[str]) -> str:
    """The text safe to send: cut before a stop string, and short of anything that may still begin one."""
    text = engine.tokenizer.decode([t for t in ids if t not in hidden], skip_special_tokens=True)
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    if cuts:  # the engine will end the request here; its result's text is cut at the same place
        return text[: min(cuts)]
    text = text.rstrip("\ufffd")  # an incomplete UTF-8 sequence waits for its next byte
    holdback = max((len(s) for s in stop), default=1) - 1
    return text[: len(text) - holdback] if holdback else text


async def _stream_one(
    engine: Any, job: Job, i: int, handle: RequestHandle, inflight: Inflight, out: asyncio.Queue[Event]
) -> None:
    loop = asyncio.get_running_loop()
    wake: asyncio.Queue[None] = asyncio.Queue()
    req = handle.request
    req.listener = lambda _r: loop.call_soon_threadsafe(wake.put_nowait, None)  # on the engine loop thread
    handle.future.add_done_callback(lambda _f: loop.call_soon_threadsafe(wake.put_nowait, None))
    hidden = set(engine.eos_token_ids) | set(req.sampler.params.stop_token_ids)
    stop = tuple(job.kwargs.get("stop", ()))
    emitted = ""
    try:
        while not handle.done():
            await wake.get()
            visible = _visible_text(engine, list(req.output_ids), hidden, stop)
            if len(visible) > len(emitted) and visible.startswith(emitted):
                await out.put((i, visible[len(emitted) :], None))
                emitted = visible
        result = await result_of(handle)
        if result.text.startswith(emitted) and len(result.text) > len(emitted):
            await out.put((i, result.text[len(emitted) :], None))
        await out.put((i, None, result))
    finally:
        inflight.cancel(handle)


async def stream(engine: Any, job: Job, inflight: Inflight) -> AsyncIterator[Event]:
    """(index, delta, None) as text arrives, then (index, None, result) once per sample. Closing the iterator
    (a client that disconnects) cancels every sample."""
    out: asyncio.Queue[Event] = asyncio.Queue()
    handles = _submit_all(engine, job, inflight)
    tasks = [asyncio.create_task(_stream_one(engine, job, i, h, inflight, out)) for i, h in enumerate(handles)]
    finished = 0
    try:
        while finished < job.n:
            failed = next((t for t in tasks if t.done() and not t.cancelled() and t.exception()), None)
            if failed is not None:
                raise failed.exception()  # type: ignore[misc]
            getter = asyncio.create_task(out.get())
            running = {t for t in tasks if not t.done()}
            done, _ = await asyncio.wait({getter, *running}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                continue
            event = getter.result()
            finished += event[2] is not None
            yield event
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def namespace_for(api_key: str | None) -> Hashable:
    """The cache namespace of a tenant: derived from its key by the server, never chosen by the client."""
    if api_key is None:
        return None
    import hashlib

    return "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:16]
