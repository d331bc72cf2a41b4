"""One engine replica: an Engine in its own process (a Ray actor), with its own torch thread count, publishing its
cache events (runtime.kv.events) for the front door's router index.

The class is plain Python; `runtime.cluster.cluster` wraps it with `ray.remote` (a threaded actor, so requests run
concurrently through the engine's own scheduler, and Ray restarts it when it dies).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from radixcache.router import EventBatch

if TYPE_CHECKING:  # the driver process imports this module to wrap the class: it needs no torch
    from radixcache.runtime.engine.loop import RequestHandle
    from radixcache.runtime.engine.options import RequestOptions

EARLY_CANCELS = 4096
ADMISSION_POLL_S = 0.02  # how often a stream looks whether its request was admitted, while it waits


class EngineReplica:
    """Replica number `replica`: an Engine built from `model` (a path or "smollm2") with `engine_kwargs`, at
    `threads` torch threads.

    `incarnation` is new each time the process starts, so the front door can tell a restarted replica (whose
    events start again from 1, over an empty cache) from a live one.
    """

    def __init__(self, replica: int, model: str, engine_kwargs: dict[str, Any] | None = None, threads: int = 1) -> None:
        import torch

        from radixcache.runtime.engine.engine import Engine

        torch.set_num_threads(threads)
        kwargs = dict(engine_kwargs or {})
        kwargs["kv_events"] = True
        self.incarnation = uuid.uuid4().hex
        # An engine that cannot be built at the start (a bad option) is kept for `info` to raise: an error in the
        # constructor would reach the front door only as Ray's ActorDiedError, its text a traceback and the exception
        # itself lost. A restart that fails still dies, so the front door keeps routing around it.
        self.error: Exception | None = None
        try:
            self.engine = Engine(model, threads=threads, **kwargs)
        except Exception as exc:
            if _restarted():
                raise
            self.error = exc
            return
        assert self.engine.events is not None, "a replica needs its cache on (enable_cache)"
        self.engine.events.replica = replica  # its batches name it
        self._handles: dict[str, RequestHandle] = {}  # the front door's request id -> the engine's handle
        # ids cancelled before their stream registered here (Ray may run `cancel` before `stream` starts): the
        # stream cancels itself on arrival. Bounded: the oldest are dropped past EARLY_CANCELS.
        self._early_cancels: OrderedDict[str, None] = OrderedDict()
        self._cancel_lock = threading.Lock()  # registering a stream and cancelling it are atomic to each other

    def info(self) -> dict[str, Any]:
        """What the front door needs to hash prompts as this replica does, and to recognise this process. Raises
        the error that kept the engine from being built, if one did."""
        if self.error is not None:
            raise self.error
        engine = self.engine
        return {
            "incarnation": self.incarnation,
            "fingerprint": engine.fingerprint,
            "page_size": engine.cache.page_size,
            "capacity_blocks": engine.cache.capacity_blocks,
            "policy": engine.cache.policy.name,
            "pid": os.getpid(),
            "model": engine.config.name,
            "max_position": engine.config.max_position,
        }

    def check_alive(self, stall_s: float | None = None) -> None:
        """Raise EngineDeadError if this replica's engine loop has died (every request here would get it), or the
        error that kept the engine from being built: the front door's check before a re-send (`info` answers from
        a live process whatever its loop's state). With `stall_s`, EngineStalledError (an EngineDeadError) when its
        loop has work and has made no progress for that long (Engine.check_alive). Cheap: nothing is asked of the
        loop."""
        if self.error is not None:
            raise self.error
        self.engine.check_alive(stall_s)

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        kwargs: dict[str, Any],
        rid: str | None = None,
        elapsed: float = 0.0,
    ) -> Any:
        """One request through the engine (blocking this actor thread, not the others); a GenerationResult.
        `cancel(rid)` aborts it, as a stream (the front door's call that stops waiting for it cancels it here).
        `elapsed`: the seconds since the front door took it, on its own clock (its `timeout` counts from then, as
        `stream`'s: a request re-sent after its replica died got it whole again)."""
        if rid is not None and self._cancelled_early(rid):
            return _cancelled(prompt_ids)
        handle = self.engine.submit(list(prompt_ids), max_new_tokens, **kwargs)
        if handle.request.deadline is not None:  # past already: it ends at the next step
            handle.request.deadline -= max(0.0, elapsed)
        if rid is None:
            return handle.result()
        self._register(rid, handle)
        try:
            return handle.result()
        finally:
            self._handles.pop(rid, None)

    def _cancelled_early(self, rid: str) -> bool:
        """Whether `rid` was cancelled before it arrived (the remembered cancel is used up): then it is not submitted.
        A cancel that comes later, before `_register`, is still found there."""
        with self._cancel_lock:
            return self._early_cancels.pop(rid, 0) is None

    def _register(self, rid: str, handle: RequestHandle) -> None:
        """`handle` runs here as `rid` until popped from `_handles`; cancelled now if its cancel came first."""
        with self._cancel_lock:
            self._handles[rid] = handle
            cancelled_early = self._early_cancels.pop(rid, 0) is None
        if cancelled_early:
            handle.cancel()

    def stream(
        self,
        rid: str,
        prompt_ids: Sequence[int],
        options: RequestOptions,
        queued_for: float = 0.0,
        elapsed: float = 0.0,
        front_admits: bool = False,
    ) -> Iterator[tuple[str, Any, Any]]:
        """One request, streamed (a Ray streaming generator): ("admitted", None, None) once the engine admits it,
        ("tokens", new token ids, their logprobs) as the engine makes them, then ("done",
        GenerationResult, the (text, token ids) the model wrote for its tool calls or None). An engine error (a full
        queue, say) is raised to the caller. `cancel(rid)` aborts it. Both times are durations the front door measured
        on its own clock up to the send, never its clock's readings (a replica on another machine reads another
        clock: a skew of seconds cut or stretched every deadline by as much): `queued_for`, the seconds the request
        has already waited for admission (the engine's queue timeout is shortened by them: that wait is not granted
        twice); `elapsed`, the seconds since the front door took it, before any replica (its `timeout` counts from
        then, as one engine's counts from `submit`: a request re-sent after its replica died got it whole again).
        `front_admits`: one of a call's several requests (a group's samples), whose one admission deadline the front
        door holds (lifted for all once the first is admitted): the engine here sets none, else a sample waiting
        behind its own siblings timed out."""
        from radixcache.runtime.engine.errors import QueueTimeoutError

        waited = max(0.0, queued_for)
        timeout = None if front_admits else self.engine.queue_timeout
        if timeout is not None and waited >= timeout:
            raise QueueTimeoutError(f"waited {waited:.2f} s to reach its replica, the queue timeout is {timeout} s")
        if self._cancelled_early(rid):  # before submitting: the engine would admit it (a prefill) before the cancel
            yield "done", _cancelled(prompt_ids), None
            return
        wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        handle = self.engine.submit(list(prompt_ids), options=options)
        deadline = handle.request.queue_deadline
        if front_admits:
            handle.request.queue_deadline = None
        elif deadline is not None and waited:
            handle.request.queue_deadline = deadline - waited
        if handle.request.deadline is not None:  # past already: it ends at the next step
            handle.request.deadline -= max(0.0, elapsed)
        self._register(rid, handle)
        req = handle.request
        req.listener = lambda _r: wake.put(None)  # on the engine loop thread
        handle.future.add_done_callback(lambda _f: wake.put(None))
        sent = 0
        # The front door is told when the request is admitted: its `queued` (/health/cache) counts it until then, and
        # with a queue timeout it holds that too. Admission wakes nothing here, hence the short polls until then.
        watching = True
        try:
            while True:
                done = handle.done()
                if watching and (req.t_admitted is not None or done):
                    watching = False
                    if req.t_admitted is not None:
                        yield "admitted", None, None
                ids = list(req.output_ids)
                if len(ids) > sent:
                    yield "tokens", ids[sent:], list(req.logprobs[sent : len(ids)])
                    sent = len(ids)
                if done:
                    break
                with contextlib.suppress(queue.Empty):
                    wake.get(timeout=ADMISSION_POLL_S if watching else None)
            result = handle.result()
            yield "done", result, self._emitted_calls(result)
        finally:
            self._handles.pop(rid, None)

    def _emitted_calls(self, result: Any) -> tuple[str, tuple[int, ...]] | None:
        """What the engine remembered the model wrote for `result`'s tool calls (text, token ids), for the front door
        to remember: it renders the conversation's next turn, and must splice in these very tokens to hit the cache.
        None without calls, or when the engine did not remember them (calls dropped past max_calls)."""
        calls = getattr(result, "tool_calls", None)
        if not calls:
            return None
        return self.engine.tool_memory.lookup_emitted(calls, result.text)

    def cancel(self, rid: str) -> bool:
        """Abort a request (streamed, or a `generate` given `rid`; its result says "cancelled"). False if it is not
        running here yet: then its stream (or generate), when it arrives, cancels itself (the id is remembered, up to
        EARLY_CANCELS of them)."""
        with self._cancel_lock:
            handle = self._handles.get(rid)
            if handle is None:
                self._early_cancels[rid] = None
                while len(self._early_cancels) > EARLY_CANCELS:
                    self._early_cancels.popitem(last=False)
                return False
        handle.cancel()
        return True

    def check(self, timeout: float | None = 30.0) -> dict[str, int]:
        return self.engine.check(timeout)

    def unpin(
        self, prompt: list[int] | None, namespace: Any, every_namespace: bool = False, holder: str | None = None
    ) -> int:
        """Engine.unpin on this replica: the pins of `prompt` in `namespace` (all of it: None), or every pin
        (`every_namespace`, without a prompt), `holder`'s shares only when it is given; how many were released."""
        if every_namespace:
            return self.engine.unpin(prompt, pin_holder=holder)
        return self.engine.unpin(prompt, namespace=namespace, pin_holder=holder)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Engine.close: cancel the requests in flight here (their streams end with "cancelled" results) and let
        queued disk writes finish, before the front door ends this actor."""
        return self.engine.close(timeout)

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait for the disk tier's queued writes (True when there is no disk tier)."""
        return self.engine.tiers is None or self.engine.tiers.disk is None or self.engine.flush(timeout)

    def events_since(self, seq: int) -> tuple[str, list[EventBatch] | None]:
        """(incarnation, the batches after `seq`), or (incarnation, None) when some are no longer kept: resync."""
        events = self.engine.events
        assert events is not None
        return self.incarnation, events.since(seq)

    def snapshot(self) -> tuple[str, int, frozenset[bytes]]:
        """(incarnation, seq, every page key the tree holds as of batch seq)."""
        events = self.engine.events
        assert events is not None
        seq, keys = events.snapshot()
        return self.incarnation, seq, keys

    def stats(self) -> Any:
        return self.engine.stats

    def counted_stats(self) -> tuple[str, Any]:
        """(incarnation, EngineStats): the front door subtracts a baseline only from the process that gave it (a
        restarted replica counts from zero again)."""
        return self.incarnation, self.engine.stats

    def set_events_history(self, batches: int) -> None:
        """Keep only the last `batches` event batches (tests: make a receiver fall behind the history)."""
        events = self.engine.events
        assert events is not None
        events.set_history(batches)


def _restarted() -> bool:
    """Whether this process is a Ray actor that Ray restarted (False outside Ray)."""
    try:
        import ray

        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:
        return False


def _cancelled(prompt_ids: Sequence[int]) -> Any:
    """The result of a request cancelled before it reached the engine: nothing generated, nothing computed."""
    from radixcache.runtime.engine.request import GenerationResult

    return GenerationResult("", (), len(prompt_ids), 0, 0, 0.0, 0.0, "cancelled")
