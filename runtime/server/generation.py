"""Run OpenAI-style requests on the Engine from asyncio: whole results, or text deltas then the result.

A chat with tools (tool_choice not "none") streams OpenAI's delta dicts instead of text: each choice's text goes
through a `ToolCallParser` (runtime.tools.parse) whose call ids are the engine request's own (`Request.call_ids`), so
the deltas assemble to the result's content and calls, ids included, and a history that replays them renders the
tokens the cache holds.

Every engine request is tracked in `Inflight`, so that a client that goes away, or the server shutting down,
cancels it (the engine frees its blocks at its next step).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import weakref
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from radixcache.runtime.engine.errors import EngineClosedError
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.engine.protocol import GenerationEngine, GenerationHandle
from radixcache.runtime.engine.request import GenerationResult
from radixcache.runtime.engine.streaming import held_back_length
from radixcache.runtime.engine.tool_calls import tool_parser
from radixcache.runtime.loading.detokenizer import IncrementalDetokenizer, text_after
from radixcache.runtime.server.stream_wakes import Wakes
from radixcache.runtime.tools import ToolCallParser
from radixcache.runtime.tools.fair_lru import TenantNamespace
from radixcache.runtime.tools.use import CallIds


class Event(NamedTuple):
    """One step of a streamed choice: new text (maybe ""), the logprobs of the tokens it covers, and the final
    result on the choice's last event."""

    index: int
    text: str
    logprobs: tuple[Any, ...] = ()
    result: GenerationResult | None = None
    deltas: tuple[dict[str, Any], ...] | None = None  # with tools: OpenAI's delta dicts this text completes


@dataclass(slots=True)
class Inflight:
    """The handles of every engine request the server has running."""

    handles: set[GenerationHandle] = field(default_factory=set)
    cancelled: int = 0  # engine requests this server aborted (client gone, shutdown)
    aborted: bool = False  # the server shut down past its grace period: what it cancels ends as shutting_down

    def cancel(self, handle: GenerationHandle) -> None:
        if not handle.done():
            self.cancelled += 1
            handle.cancel()

    def cancel_all(self) -> int:
        live = [h for h in list(self.handles) if not h.done()]
        for h in live:
            self.cancel(h)
        return len(live)

    def abort(self) -> int:
        """Shutting down, past the grace period: cancel every request, and refuse new ones. A request cancelled so
        fails with EngineClosedError (503 shutting_down; in a stream, an error event then `[DONE]`) instead of
        reading as a reply the model finished. Returns how many were running."""
        self.aborted = True
        return self.cancel_all()

    def checked(self, result: GenerationResult) -> GenerationResult:
        """`result`, unless `abort` cancelled it: a cancelled result says finish_reason "stop" to the client."""
        if self.aborted and result.finish_reason == "cancelled":
            raise EngineClosedError("the server is shutting down: this request was aborted")
        return result


@dataclass(frozen=True, slots=True)
class Job:
    """One HTTP request's generation: tokenised prompts (completions may send several), n samples of each, the
    request's options (sampling, namespace, timeout, ...; built once from the body). Choice `p * n + j` is sample
    j of prompt p, as OpenAI numbers them. `max_tokens` may be 0 (an empty completion, never sent to the engine)."""

    prompts: list[list[int]]
    n: int
    max_tokens: int
    options: RequestOptions
    tool_format: str = "generic"  # how the model writes calls (runtime.tools.features): "generic", "native", "hermes"
    call_tokens: frozenset[int] = frozenset()  # special tokens its text shows: its calls' syntax (tools.call_tokens)

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    def sample_seed(self, i: int) -> dict[str, Any]:
        """Choice i's own options over the job's: a seeded request samples choice i with `seed + i`."""
        seed = self.options.sampling.seed
        return {} if seed is None else {"seed": seed + i}


async def result_of(handle: GenerationHandle) -> GenerationResult:
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


def _submit_all(engine: GenerationEngine, job: Job, inflight: Inflight) -> list[GenerationHandle]:
    """Every choice of the job, in choice order, queued in one call: the engine's queue takes the whole job or
    refuses it (a full queue: QueueFullError, nothing queued; more choices than `max_queue`: a ValueError, as no wait
    would let them in), so the job's own choices never count against it. Several choices go as one group
    (Engine.submit_group): they share their prompts' KV in flight, and none counts another's prefill as cached."""
    if inflight.aborted:  # the server's shutdown aborted what ran: nothing new starts
        raise EngineClosedError("the server is shutting down")
    if job.choices == 1:  # alone: its cached_tokens count what the tree holds when it is admitted
        options = job.options.updated(**job.sample_seed(0))
        handles: list[GenerationHandle] = [engine.submit(job.prompts[0], job.max_tokens, options=options)]
    else:
        prompts = [prompt for prompt in job.prompts for _ in range(job.n)]  # choice p * n + j: sample j of prompt p
        each = [job.sample_seed(i) for i in range(job.choices)]
        handles = engine.submit_group(prompts, job.max_tokens, options=job.options, each=each)
    for handle in handles:
        inflight.handles.add(handle)
        # the handle weakly (the set holds it until then): a future -> callback -> handle -> future cycle would keep
        # each finished request, its tokens and logits, until a collection
        handle.future.add_done_callback(functools.partial(_forget, inflight.handles, weakref.ref(handle)))
        if inflight.aborted:  # the abort came while this thread submitted: it missed these
            inflight.cancel(handle)
    return handles


def _forget(handles: set[GenerationHandle], ref: weakref.ref[GenerationHandle], _future: object) -> None:
    handle = ref()
    if handle is not None:
        handles.discard(handle)


async def submit_off_loop(engine: GenerationEngine, job: Job, inflight: Inflight) -> list[GenerationHandle]:
    """`_submit_all` in a worker thread: building a request compiles its grammar (2 to 40 ms for a new schema; more
    at a server's start, until its vocabulary is built) and checks its prompt, and the event loop must keep serving
    every other stream meanwhile. Cancelling the awaiting task (a client gone) cancels the handles the thread makes."""
    task = asyncio.ensure_future(asyncio.to_thread(_submit_all, engine, job, inflight))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:

        def cancel_made(t: asyncio.Future[list[GenerationHandle]]) -> None:
            if not t.cancelled() and t.exception() is None:
                for h in t.result():
                    inflight.cancel(h)

        task.add_done_callback(cancel_made)
        raise


async def complete(engine: GenerationEngine, job: Job, inflight: Inflight) -> list[GenerationResult]:
    """The n results of a job; cancelling the awaiting task cancels every engine request."""
    handles = await submit_off_loop(engine, job, inflight)
    try:
        return [inflight.checked(r) for r in await asyncio.gather(*(result_of(h) for h in handles))]
    finally:
        for h in handles:
            inflight.cancel(h)


def _visible_end(output: IncrementalDetokenizer, stop: Sequence[str], sent: int) -> int:
    """Where the text safe to send ends: before a stop string, and short of anything that may still begin one. The
    output holds whole characters only (an incomplete UTF-8 sequence waits for its next byte); `sent`: the characters
    sent so far, which end before any stop string (so it is searched for only past them, less its length: the
    work a token is bounded, not the text's length)."""
    since = max(0, sent - max((len(s) for s in stop), default=0))
    end = output.since(since)
    cuts = [i for i in (end.find(s) for s in stop) if i >= 0]
    if cuts:  # the engine ends the request here (under a grammar, maybe later: the rest then comes with the result)
        return since + min(cuts)
    return held_back_length(output.length, stop)


async def _stream_one(
    engine: GenerationEngine,
    job: Job,
    i: int,
    handle: GenerationHandle,
    inflight: Inflight,
    out: asyncio.Queue[Any],
    wakes: Wakes | None = None,
) -> None:
    """Events of one choice: an empty one at its first token, then one per growth of the visible text with the
    logprobs of the tokens generated since the last, then the remainder with the result. A request that ends
    before its first token (refused, timed out in the queue) sends no event before its error. `wakes`: the stream's,
    shared by its choices (one loop wake for all those an engine step told); by default one of its own."""
    if wakes is None:
        wakes = Wakes(asyncio.get_running_loop(), job.choices)
    req = handle.request
    req.listener = lambda _r: wakes.mark(i)  # on the engine loop thread
    handle.future.add_done_callback(lambda _f: wakes.mark(i))
    hidden = set(engine.eos_token_ids) | set(req.sampler.params.stop_token_ids)
    stop = job.options.sampling.stop
    parser = _tool_parser(job, req)
    # The output's text, decoded as its tokens come (decoding all of it at every token made a long stream
    # quadratic, on the event loop every other stream shares); it reads as the result's text does: after the
    # prompt's last tokens (a SentencePiece tokenizer's first " Paris" keeps its space).
    prompt = job.prompts[i // job.n]
    output = IncrementalDetokenizer(_decoder(engine, job.call_tokens), prompt)
    emitted, sent_logprobs, started, decoded, last = 0, 0, False, 0, None  # emitted: characters sent
    try:
        while not handle.done():
            await wakes.wait(i)
            new = req.output_ids[decoded:]  # only the tokens since the last wake (a copy of all was O(length))
            for t in new:  # one at a time, as the result's text reads them (loading.detokenizer)
                if t not in hidden:
                    output.add(t)
            decoded, last = decoded + len(new), new[-1] if new else last
            visible = _visible_end(output, stop, emitted)
            grew = visible > emitted
            if grew or (decoded and not started):  # never before a token: a refusal must still be an HTTP status
                started = True
                shown = decoded - (last in hidden)  # a final stop token is not shown, nor its logprob
                logprobs = tuple(req.logprobs[sent_logprobs:shown])
                sent_logprobs += len(logprobs)
                text = output.since(emitted)[: visible - emitted] if grew else ""
                deltas = None if parser is None else tuple(parser.feed(text))
                await out.put(Event(i, text, logprobs, deltas=deltas))
                emitted = max(visible, emitted)
        result = inflight.checked(await result_of(handle))
        whole = result.text if parser is None else _raw_text(engine, job, prompt, result, hidden)
        rest = whole[emitted:] if whole.startswith(output.text[:emitted]) else ""
        shown = tuple(result.logprobs or ())[: shown_tokens(engine, result)]
        deltas = None if parser is None else (*parser.feed(rest), *parser.finish())
        await out.put(Event(i, rest, shown[sent_logprobs:], result, deltas))
    finally:
        inflight.cancel(handle)


def _tool_parser(job: Job, req: Any) -> ToolCallParser | None:
    """The parser of a choice whose calls are parsed: its ids are the engine request's (a replica's request has
    none here: fresh ones)."""
    use = job.options.tool_use
    if use is None or not use.parses_calls:
        return None
    return tool_parser(use, job.tool_format, getattr(req, "call_ids", None) or CallIds())


def _decoder(engine: GenerationEngine, keep: frozenset[int] = frozenset()) -> Callable[[Sequence[int]], str]:
    """The text of output ids: without special tokens, but those in `keep` (a tool-call syntax's, as the engine
    shows them in the text it parses calls from)."""
    if keep:
        return lambda ids: engine.tokenizer.decode(list(ids), skip_special_tokens=True, keep=keep)
    return lambda ids: engine.tokenizer.decode(list(ids), skip_special_tokens=True)


def _raw_text(
    engine: GenerationEngine, job: Job, prompt: Sequence[int], result: GenerationResult, hidden: set[int]
) -> str:
    """The whole text a result's tokens show after `prompt`, before tool calls were parsed out of it (cut where the
    engine's stop string cut it: under a grammar, not the first place one appears, which may be inside a call)."""
    text = text_after(_decoder(engine, job.call_tokens), prompt, [t for t in result.token_ids if t not in hidden])
    return text if result.stop_at is None else text[: result.stop_at]


def ends_in_text(engine: GenerationEngine, job: Job, result: GenerationResult) -> bool:
    """Whether a reply with calls wrote text after its last call (its stream's last item is then a message, the one
    being written if the reply was cut): its raw text parsed again, as its stream parsed it."""
    parser = _tool_parser(job, None)
    if parser is None or not result.tool_calls:
        return False
    sampling = job.options.sampling
    hidden = set(engine.eos_token_ids) | set(sampling.stop_token_ids)
    prompt = job.prompts[0]  # a Responses request has one prompt
    deltas = [*parser.feed(_raw_text(engine, job, prompt, result, hidden)), *parser.finish()]
    written = [d for d in deltas if "tool_calls" in d or d.get("content")]
    return bool(written) and "tool_calls" not in written[-1]


def shown_tokens(engine: GenerationEngine, result: GenerationResult) -> int:
    """Generated tokens whose text the caller sees: all but a final stop token."""
    n = len(result.token_ids)
    if n and result.finish_reason == "stop" and result.token_ids[-1] in engine.eos_token_ids:
        return n - 1
    return n


async def stream(engine: GenerationEngine, job: Job, inflight: Inflight) -> AsyncIterator[Event]:
    """Events of every choice, interleaved as they come; each choice ends with an event that has its result.
    Closing the iterator (a client that disconnects) cancels every choice. Refusals (a full queue) raise before
    the first event; a failure later raises where it happens. A choice that fails once its request has tokens,
    before any event went out (its siblings slower to show theirs), first yields the empty event of its first
    token: the failure is then an error inside the stream, not an HTTP status, whichever choice reported first."""
    # One queue that every choice feeds, each its events then its task once it ends (a done callback runs after the
    # task's last put): an event costs O(1) however many choices run (a wait over all of them, rebuilt at every
    # event, made a 64-choice stream twice as slow as its whole answer), and a failure is seen in the order it came.
    out: asyncio.Queue[Event | asyncio.Task[None]] = asyncio.Queue()
    handles = await submit_off_loop(engine, job, inflight)
    wakes = Wakes(asyncio.get_running_loop(), job.choices)
    tasks = [asyncio.create_task(_stream_one(engine, job, i, h, inflight, out, wakes)) for i, h in enumerate(handles)]
    for task in tasks:
        task.add_done_callback(out.put_nowait)
    finished, started = 0, False
    try:
        while finished < job.choices:
            item = await out.get()
            if isinstance(item, asyncio.Task):
                if item.cancelled() or item.exception() is None:
                    continue  # a choice that ended well: its last event came before
                i = tasks.index(item)
                if not started and list(getattr(handles[i].request, "output_ids", ())):
                    started = True
                    yield Event(i, "")
                raise item.exception()  # type: ignore[misc]
            finished += item.result is not None
            started = True
            yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def namespace_for(api_key: str | None, cache_salt: str | None = None) -> Hashable:
    """The cache namespace of a caller, derived by the server, never named by the client: its key (a tenant), its
    `cache_salt` (a keyless caller who wants a cache of its own, as vLLM's), both together, or None (the shared
    namespace of keyless callers without a salt). Keys and salts are hashed, so the tree never holds them. A salted
    or keyed namespace is a TenantNamespace naming its tenant, the namespace of its key alone (None for keyless
    callers): the scope whose share of the shared bounded caches (compiled grammars, tool-call memory, legacy call
    ids: runtime/tools/fair_lru.py) its entries count against, so a new salt per request gains no share."""
    if api_key is None and cache_salt is None:
        return None
    tenant = None if api_key is None else _hashed(api_key, None)
    return TenantNamespace(_hashed(api_key, cache_salt), tenant)


def _hashed(api_key: str | None, cache_salt: str | None) -> str:
    digest = hashlib.sha256()
    for part in (api_key, cache_salt):
        digest.update(b"\x00" if part is None else b"\x01" + part.encode() + b"\x00")
    return "ns:" + digest.hexdigest()[:32]
