"""What the OpenAI server needs of an Engine, served by replicas: `ClusterEngine` routes each request through a
ReplicaCluster and streams its tokens back from the replica (a Ray streaming generator), so `radixcache serve
--replicas N` is the existing server in front of N engines.

A request is retried on another replica when its replica dies before sending a token, at most once
(runtime.cluster.resend: a request that crashes its replica would take down each in turn); after its first token,
or a second death, it fails with ReplicaUnavailableError (HTTP 503, or an error event in a stream): tokens already
sent cannot be taken back. A request never waits on a dead replica: Ray fails the stream's next item at once. Nor
on a live one that stops sending: each item of the stream is awaited at most the cluster's `call_timeout` seconds;
past it the request is cancelled on the replica, its load released, and it fails with ReplicaUnavailableError (the
replica stays in the routing set: it is alive, only slow or stuck). Its `timeout` counts from when the front door
took it, held here too (runtime.cluster.stream_wait.TimeoutCut): a replica counts it from when its call starts
there, after any wait in Ray's queue for an actor thread.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import InvalidStateError
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from radixcache.page_hash import namespace_key
from radixcache.runtime.cluster.calls import own_calls
from radixcache.runtime.cluster.cluster import ReplicaCluster
from radixcache.runtime.cluster.front_calls import ReplicaCalls
from radixcache.runtime.cluster.handles import CallAdmission, FrontQueue, RemoteHandle, RemoteRequest, SeenTimes
from radixcache.runtime.cluster.limits import check_model_limits
from radixcache.runtime.cluster.resend import after_death, engine_reason
from radixcache.runtime.cluster.stream_wait import NotStarted, TimeoutCut, end_by, next_item
from radixcache.runtime.cluster.tally import Baseline, Counters, _add, replica_rows  # noqa: F401 (_add: its tests)
from radixcache.runtime.engine.errors import EngineClosedError, ReplicaUnavailableError
from radixcache.runtime.engine.options import RequestOptions, check_each, check_group, each_options, resolve_options
from radixcache.runtime.engine.request import GenerationResult
from radixcache.runtime.engine.request_builder import check_text_fits, group_prompts, token_ids
from radixcache.runtime.kv.leases import NO_LEASE
from radixcache.runtime.kv.tier.disk_writer import wait_bound
from radixcache.runtime.loading.prompt_bound import token_bytes_bound
from radixcache.runtime.tools import ToolCallMemory, tool_template_features
from radixcache.runtime.tools.use import CallIds

# The front door fails a request its replica has not admitted within the queue timeout plus this (the replica's own
# verdict, with its wording, gets the first chance; under a starved CPU it can come back over Ray seconds late).
ADMISSION_GRACE_S = 0.25
log = logging.getLogger("radixcache.cluster")


class ClusterEngine(ReplicaCalls):
    """An Engine-shaped front door over `cluster` (runtime.cluster.cluster.ReplicaCluster) for the server and the
    replay: it satisfies runtime.engine.protocol.GenerationEngine, and takes the same RequestOptions (or their
    keywords); a request's `session` and `namespace` choose its replica, the rest goes to the replica's engine.

    `model` names the model the replicas run; only its config and tokenizer are loaded here (no weights).

    `tool_memory` remembers the text and token ids a replica's model wrote for each tool call (as an Engine's does),
    so the server renders a conversation's next turn with them: it extends the last prompt and reply token for token
    and hits the cache of whichever replica holds them.
    """

    def __init__(self, cluster: ReplicaCluster, model: str) -> None:
        from radixcache.runtime.loading import load_config_and_tokenizer

        self.cluster = cluster
        self.config, self.tokenizer = load_config_and_tokenizer(model)
        tok_eos = tuple(getattr(self.tokenizer, "eos_token_ids", ()) or ())
        self.eos_token_ids = tuple(dict.fromkeys((*self.config.eos_token_ids, *tok_eos)))
        info = cluster.info
        self.cache = SimpleNamespace(
            capacity_blocks=info["capacity_blocks"],
            page_size=info["page_size"],
            policy=SimpleNamespace(name=info["policy"]),
        )
        page = info["page_size"]
        self.kv = SimpleNamespace(pages=lambda n: -(-n // page))
        self.queue = FrontQueue()  # its requests no replica has started yet (/health/cache's `queued`)
        self.enable_cache = True
        self.routes_sessions = True  # the server passes `session` (prompt_cache_key, user or X-Session-Id)
        self.tool_memory = ToolCallMemory()  # the calls the replicas' model wrote, by this front door's call ids
        self._call_id_length = tool_template_features(self.tokenizer).call_id_length  # Mistral's 9, say
        self._per_token = functools.cache(lambda: token_bytes_bound(self.tokenizer))  # loading.prompt_bound
        self._ids = itertools.count()
        self._rid_prefix = uuid.uuid4().hex[:12]  # replicas remember early cancels by id: ids unique across fronts
        self._closed = False
        self._running: set[RemoteHandle] = set()  # handles whose `_run` has not ended (wait_idle waits for none)
        self._idle = threading.Condition()
        self._baseline = Baseline()  # each replica's stats after the replay's warm-up: per_replica counts from there
        self._counters = Counters()  # `stats`' counters: never back when a replica dies or restarts
        self._replica_up: dict[int, bool] = {}  # each replica: whether it answered the last `stats` read

    # ------------------------------------------------------------------ requests

    def submit(
        self,
        prompt: Sequence[int],
        max_new_tokens: int | None = None,
        *,
        options: RequestOptions | None = None,
        **kwargs: Any,
    ) -> RemoteHandle:
        """Route `prompt` (token ids) and stream it on a replica; a handle at once."""
        if self._closed:
            raise EngineClosedError("this server is shutting down")
        opts = resolve_options(max_new_tokens, options, kwargs, "ClusterEngine.submit")
        return self._start(self._prompt_ids(prompt, opts), opts)

    @staticmethod
    def _options(max_new_tokens: int | None, kwargs: dict[str, Any], caller: str) -> RequestOptions:
        """A call's options, an unknown keyword's TypeError naming that call (not the `submit` it goes through)."""
        return resolve_options(max_new_tokens, kwargs.pop("options", None), kwargs, f"ClusterEngine.{caller}")

    def submit_group(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int | None = None,
        *,
        each: Sequence[dict[str, Any]] = (),
        options: RequestOptions | None = None,
        **kwargs: Any,
    ) -> list[RemoteHandle]:
        """The n samples of one prompt: routed one by one (the first's pages reach the index as it computes them).
        All or none, as Engine.submit_group: every prompt and option is checked before any request is sent. Under a
        queue timeout they share one admission deadline, lifted for all once the first is admitted (CallAdmission),
        as one engine's group."""
        if self._closed:
            raise EngineClosedError("this server is shutting down")
        prompts = group_prompts(prompts)
        check_group(len(prompts), "ClusterEngine.submit_group")
        check_each(each, len(prompts))
        opts = resolve_options(max_new_tokens, options, kwargs, "ClusterEngine.submit_group")
        mine = each_options(opts, each, "ClusterEngine.submit_group") or [opts] * len(prompts)
        ids = [self._prompt_ids(p, o) for p, o in zip(prompts, mine, strict=True)]
        timeout = self.cluster.queue_timeout
        call = CallAdmission(timeout) if timeout is not None and len(ids) > 1 else None
        return [self._start(p, o, call) for p, o in zip(ids, mine, strict=True)]

    def _prompt_ids(self, prompt: Any, opts: RequestOptions) -> list[int]:
        """`prompt`'s token ids, checked here as the engine checks them: `list()` would take bytes or a dict for
        token ids, and a request that fails later does so in its thread, with whatever the router or the hasher
        raised."""
        if isinstance(prompt, str):  # a text past the context in bytes: refused untokenised, as Engine's
            check_text_fits(prompt, self.config.max_position, self._per_token)
        ids = list(self.tokenizer.encode(prompt)) if isinstance(prompt, str) else token_ids(prompt, "prompt")
        if not ids:
            raise ValueError("the prompt is empty")
        check_model_limits(self.config, ids, opts.sampling)  # max_position, the vocabulary: at the call, as Engine's
        namespace_key(opts.namespace)  # ValueError for one with no name in page keys (the front door hashes them)
        return ids

    def _start(self, prompt: list[int], opts: RequestOptions, call: CallAdmission | None = None) -> RemoteHandle:
        """A handle for `prompt`, its request routed and streamed by a thread of its own."""
        use = opts.tool_use
        request = RemoteRequest(
            f"{self._rid_prefix}-{next(self._ids)}",
            sampler=SimpleNamespace(params=opts.sampling),
            call_ids=CallIds(length=self._call_id_length) if use is not None and use.parses_calls else None,
        )
        handle = RemoteHandle(request, self._cancel)
        handle.unstarted = lambda finish: SeenTimes().applied(unstarted(prompt, opts, finish), handle.sent_at)
        with self._idle:
            self._running.add(handle)
        self.queue.mark(request.rid, True)
        try:
            threading.Thread(target=self._run, args=(handle, prompt, opts, call), daemon=True).start()
        except BaseException:  # no thread ("can't start new thread"): nothing will end it, so it is not in flight
            self._forget(handle)
            raise
        return handle

    def _forget(self, handle: RemoteHandle) -> None:
        """`handle` is no longer in flight: wait_idle (and close) stop waiting for it."""
        self.queue.mark(handle.rid, False)
        with self._idle:
            self._running.discard(handle)
            self._idle.notify_all()

    def generate(self, prompt: Sequence[int], max_new_tokens: int | None = None, **kwargs: Any) -> Any:
        """Submit and wait; an interrupted wait (Ctrl-C) cancels the request on its replica, as Engine.generate."""
        handle = self.submit(prompt, options=self._options(max_new_tokens, kwargs, "generate"))
        try:
            return handle.result()
        except BaseException:
            handle.cancel()
            raise

    async def agenerate(self, prompt: Sequence[int], max_new_tokens: int | None = None, **kwargs: Any) -> Any:
        """`generate` for asyncio (the replay's concurrent driver); cancelling the task cancels the request."""
        import asyncio

        handle = self.submit(prompt, options=self._options(max_new_tokens, kwargs, "agenerate"))
        try:
            return await asyncio.wrap_future(handle.future)
        except asyncio.CancelledError:
            handle.cancel()
            raise

    def record_trace(self, path: Any) -> None:
        """Recording a trace needs one engine (each replica sees only its share): refused, unless stopping one."""
        if path is not None:
            raise ValueError("recording a trace needs one engine, not replicas")

    def _run(
        self, handle: RemoteHandle, prompt: list[int], options: RequestOptions, call: CallAdmission | None = None
    ) -> None:
        cluster, req = self.cluster, handle.request
        ray = cluster.ray
        tried: set[int] = set()  # the replicas that failed it: never offered it again
        died: set[int] = set()  # those whose death the front door first saw after it was sent there (resend)
        sent_at = handle.sent_at
        queue_timeout = cluster.queue_timeout

        def admit_by() -> float | None:  # read at each wait: a call's deadline is lifted once any of it is admitted
            at = None if admitted else sent_at + queue_timeout if call is None else call.by  # type: ignore[operator]
            return None if at is None else at + ADMISSION_GRACE_S

        try:  # whatever raises from here ends the handle (its caller would wait for ever) and leaves no request
            request = cluster.route_request(prompt, options.max_new_tokens, options.namespace, options.session)
            options = options.updated(session=None)  # the session chose the replica; its engine never sees it
            end_at = end_by(handle.sent_at, options.timeout)  # past it, the front door ends it (stream_wait)
            answer_by = None if options.timeout is None else handle.sent_at + options.timeout  # its sync's bound
            cut = TimeoutCut(handle.sent_at, options.timeout)  # the timeout, held here too (a wait in Ray's queue)
            result = None
            while result is None:
                replica, rid = cluster.dispatch(request, tried)
                req.replica = replica
                self.queue.mark(req.rid, True)  # (re-)sent: waiting until this replica starts it
                started = stalled = req.started = False
                admitted = queue_timeout is None  # the admission deadline: only with a queue timeout
                seen = SeenTimes()  # this replica's admission, first token and end, on this front door's clock
                cut.sent()
                mark = cluster.death_mark()  # before it is sent: a death seen later may be its doing
                try:
                    streaming = cluster.actor(replica).stream.options(num_returns="streaming")
                    now = time.monotonic()  # durations, each side on its own clock (runtime.cluster.replica)
                    held = call is not None  # its admission deadline is the call's, held here: none on the replica
                    stream = streaming.remote(req.rid, prompt, options, now - sent_at, now - handle.sent_at, held)
                    if handle.cancelled:  # cancelled before `replica` was set: `_cancel` could not name it
                        cluster.control(replica, "cancel").remote(req.rid)
                    while result is None:  # the last item is ("done", result): never wait past it
                        item = next_item(cluster, stream, replica, req.rid, admit_by, end_at, cut)
                        kind, value, extra = ray.get(item)
                        if not started:  # its admission (or an end before it): no longer queued
                            started = cut.started = req.started = True
                            self.queue.mark(req.rid, False)
                        seen.saw(kind)
                        if kind == "admitted":
                            admitted = True
                            if call is not None:
                                call.admitted()
                        elif kind == "tokens":
                            if not req.output_ids:  # a first token: its prefill is computed, only decode is left
                                cluster.prefill_done(replica, rid)
                            req.output_ids.extend(value)
                            req.logprobs.extend(extra)
                            if req.listener is not None:
                                try:
                                    req.listener(req)
                                except BaseException:  # the caller's side failed: the replica stops it too
                                    cluster.control(replica, "cancel").remote(req.rid)
                                    raise
                        else:
                            result = own_calls(self.tool_memory, value, extra, req, options.namespace)
                except (*cluster.actor_errors, ray.exceptions.RayTaskError) as exc:
                    if not cluster.actor_died(replica, exc):  # the engine refused or failed it: its own exception
                        raise exc.as_instanceof_cause() if hasattr(exc, "as_instanceof_cause") else exc from None
                    if req.output_ids:  # Ray's text (actor id, node, RPC codes) to the log; the engine's own: both
                        log.warning("engine replica %d became unavailable mid-request %s: %s", replica, req.rid, exc)
                        raise ReplicaUnavailableError(
                            f"engine replica {replica} became unavailable mid-request, after {len(req.output_ids)} "
                            f"tokens{engine_reason(exc)} (tokens already sent cannot be re-sent)"
                        ) from None
                    if handle.cancelled:  # its caller cancelled it: not re-sent for nobody (a second replica's work)
                        result, stalled = unstarted(prompt, options, "cancelled"), True
                        continue
                    after_death(cluster, tried, died, replica, mark, exc)
                    cluster.count_retry()
                    if admitted:  # its wait in a queue had ended: the queue timeout counts from the new send
                        sent_at, call = time.monotonic(), None  # its own, no longer its call's
                except ReplicaUnavailableError:  # its replica sent nothing for call_timeout: no sync with it either
                    stalled = True
                    raise
                except NotStarted:  # its timeout passed before its replica sent anything: cancelled there, nothing done
                    stalled = True
                    result = unstarted(prompt, options, "timeout")
                finally:  # before the caller sees the result: the next turn it sends must find this one's pages
                    computed = result is not None or bool(req.output_ids) or seen.admitted is not None
                    cluster.done(replica, rid, computed=computed and not stalled, by=answer_by)
            if cut.fired and result.finish_reason == "cancelled" and not handle.cancelled:  # cut for its timeout
                result = replace(result, finish_reason="timeout")
            handle.future.set_result(seen.applied(result, handle.sent_at))
        except BaseException as exc:
            cause = getattr(exc, "cause", None)
            with contextlib.suppress(InvalidStateError):  # done already: a cancel ended it before its replica began
                handle.future.set_exception(cause if isinstance(cause, BaseException) else exc)
        finally:
            self._forget(handle)

    def _cancel(self, handle: RemoteHandle) -> None:
        """Cancel on the replica it was sent to; one cancelled before its dispatch is cancelled there by `_run`
        (the replica remembers a cancel that arrives before the stream starts). One its replica has not started
        (waiting in Ray's queue for an actor thread, or in its engine's queue) ends "cancelled" at once, with
        nothing generated, as one engine's queued request: its caller waited until an actor thread took it. Once per
        handle: a second call (agenerate's, after the cancelled future's own) finds it sent, or left to `_run`."""
        if handle.cancelled:
            return
        handle.cancelled = True
        replica, future = handle.request.replica, handle.future
        # A future the caller cancelled (`asyncio.wrap_future` cancels it with the awaiting task) is done, but its
        # request still runs on the replica: only one that `_run` completed has nothing left to cancel there.
        if replica is not None and not (future.done() and not future.cancelled()):
            self.cluster.control(replica, "cancel").remote(handle.rid)
        if not handle.request.started and handle.unstarted is not None:  # `_run` ends later, its result unused
            with contextlib.suppress(InvalidStateError):
                future.set_result(handle.unstarted("cancelled"))

    # ------------------------------------------------------------------ server upkeep

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request sent through this front door is in flight (False on timeout), as Engine.wait_idle:
        the server cancels its requests at shutdown and waits here before `close` ends the replicas."""
        bound = wait_bound(timeout)
        with self._idle:
            return self._idle.wait_for(lambda: not self._running, bound)

    def close(self, timeout: float | None = 30.0) -> bool:
        """As Engine.close: refuse new requests, close every replica's engine (its requests in flight end
        "cancelled", with what they generated, and its queued disk writes finish), wait for their results to reach
        their callers, then end the replicas. False if that took longer than `timeout` (the replicas end anyway)."""
        bound = wait_bound(timeout)  # before anything closes, as Engine.close checks it
        self._closed = True
        deadline = None if bound is None else time.monotonic() + bound
        cluster, idle = self.cluster, True
        errors = cluster.ray.exceptions
        try:
            for ref in [cluster.control(r, "close").remote(bound) for r in cluster.alive]:  # all close at once
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    idle = bool(cluster.ray.get(ref, timeout=left)) and idle
                except cluster.actor_errors:  # a dead replica has nothing left to cancel or write
                    pass
                except (errors.GetTimeoutError, errors.RayTaskError):
                    idle = False
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            idle = self.wait_idle(left) and idle
        finally:
            cluster.close()
        return idle


def unstarted(prompt: list[int], options: RequestOptions, finish: str) -> GenerationResult:
    """What one engine returns for a request that ended before it was admitted (its `timeout` passed, `finish`
    "timeout", or it was cancelled, "cancelled"): nothing generated (its times are the front door's:
    SeenTimes.applied)."""
    return GenerationResult(
        text="",
        token_ids=(),
        prompt_tokens=len(prompt),
        cached_tokens=0,
        prefill_tokens=0,
        ttft_s=0.0,
        latency_s=0.0,
        finish_reason=finish,
        logprobs=None if options.sampling.logprobs is None else (),
        lease=None if options.retain_for is None else NO_LEASE,
    )
