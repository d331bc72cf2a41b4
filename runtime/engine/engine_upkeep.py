"""Upkeep: the layer of `Engine` (engine.engine) for its life and state rather than its requests.

`close` (refuse new calls, cancel what is in flight, wait for the loop thread and the queued disk writes, stop a
recording, let go of the frozen heap), `flush` and `wait_idle`; `unpin` (pins, by prompt, namespace or holder;
`unpin_later`, a holder's, posted to the loop without waiting),
`clear_retention`, `record_trace`; `check`, `check_alive`, `stats` and the repr.

Invariants: everything that reads or changes the cache, the pins or the retention marks runs on the loop thread
(`EngineLoop.wait_for`), between two steps; every wait takes a bound checked by `wait_bound` (None or infinity: no
bound; ValueError unless a number >= 0) before anything is done; `close` may be called again, harmlessly.
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any

from radixcache import RadixCache
from radixcache.runtime.config import ModelConfig
from radixcache.runtime.engine.errors import EngineStalledError
from radixcache.runtime.engine.loop import EngineLoop
from radixcache.runtime.engine.options import resolve_options
from radixcache.runtime.engine.output import OutputProcessor
from radixcache.runtime.engine.request_builder import Messages, Prompt, RequestBuilder, is_messages
from radixcache.runtime.engine.scheduler import Scheduler
from radixcache.runtime.engine.stats import EngineStats, checked_gauges, engine_stats
from radixcache.runtime.engine.threads import ThreadController
from radixcache.runtime.engine.trace_recorder import TraceRecorder, record_to
from radixcache.runtime.kv.manager import KVManager
from radixcache.runtime.kv.retention import RetentionPolicy
from radixcache.runtime.kv.tier.coordinator import KVTiers
from radixcache.runtime.kv.tier.disk_writer import wait_bound


class EngineUpkeep:
    """`close`, `flush`, `wait_idle`, `unpin`, `unpin_later`, `clear_retention`, `record_trace`, `check`,
    `check_alive`, `stats` (set up in Engine.__init__)."""

    config: ModelConfig
    cache: RadixCache
    kv: KVManager
    tiers: KVTiers | None
    retention: RetentionPolicy
    output: OutputProcessor
    scheduler: Scheduler
    thread_control: ThreadController
    fingerprint: Any
    enable_cache: bool
    _builder: RequestBuilder
    _loop: EngineLoop
    _closed: bool
    _release_heap: weakref.finalize

    def unpin(self, prompt: Prompt | Messages | None = None, **kwargs: Any) -> int:
        """Release pins: those made for `prompt` (in `namespace`; a fork's: its prefix), every pin of `namespace`
        when it is given alone, or every pin, every holder's (`pin_holder=h`: h's only); how many. Takes what the
        pinning call took: chat messages rendered as `chat` renders them, with its `tools=` or `options=` (a
        TypeError names any other keyword than generate's)."""
        opts = resolve_options(kwargs.pop("max_new_tokens", None), kwargs.pop("options", None), kwargs, "Engine.unpin")
        text = self._builder.render_for(prompt, opts) if is_messages(prompt) else prompt
        tokens = None if text is None else self._builder.encode(text)
        everywhere = "namespace" not in kwargs and opts.namespace is None  # unpin(): every namespace's pins
        holder = opts.pin_holder  # a holder's own share only; None: every holder's
        return self._loop.wait_for(lambda _: self.kv.pins.unpin(tokens, opts.namespace, everywhere, holder=holder))

    def unpin_later(self, pin_holder: str) -> None:
        """`unpin(pin_holder=pin_holder)` without waiting: every pin the holder holds, in every namespace, is released
        before the loop's next step or command (`check()` sees it; an idle engine's at its next call, `stats` once it
        ran). It takes no lock and never waits, so a finalizer may call it on any thread, the loop's own mid-step
        included (a Session's does, once the session is collected)."""
        pins = self.kv.pins  # not `self`: a posted call keeps no engine alive
        self._loop.post(lambda _: pins.unpin(None, None, True, holder=pin_holder))

    def close(self, timeout: float | None = 30.0) -> bool:
        """Refuse new requests (EngineClosedError), cancel every request in flight (their results say "cancelled",
        with what they generated), wait for the loop thread to exit, then for the queued disk writes. The cache keeps
        what it holds. Returns False if the thread was still busy after `timeout` seconds, which bound the whole close
        (None or infinity: no bound; ValueError, before anything is done, unless a number >= 0). Calling it again is
        harmless."""
        timeout = wait_bound(timeout)
        ends = None if timeout is None else time.monotonic() + timeout  # `timeout` bounds the whole close
        self._closed = True
        idle = self._loop.stop(timeout)  # a caller past the checks above (still building its request) is refused
        if idle and self.tiers is not None:  # the disk writes still queued finish (a restart then finds them)
            self.tiers.close(None if ends is None else max(0.0, ends - time.monotonic()))
        if idle:  # its threads (llguidance's, up to 32) would stay while the closed engine is referenced
            self.output.masker.close()
        self.record_trace(None)  # a recording writes what it still holds and closes its file
        self._release_heap()
        return idle

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until the disk tier has written every page queued so far (True; False on timeout or no disk
        tier). Writes never delay requests; call this before a planned exit or to measure what is persisted.
        `timeout`: None or infinity for no bound; ValueError unless a number >= 0 (NaN waited for ever)."""
        timeout = wait_bound(timeout)
        if self.tiers is None or self.tiers.disk is None:
            return False
        return self.tiers.disk.flush(timeout)

    def record_trace(self, path: str | os.PathLike[str] | None) -> TraceRecorder | None:
        """Write every request that leaves from now on to `path`, one Mooncake-format JSONL line each: arrival time,
        lengths, chained page hashes at this engine's page size, the `session` given to `generate` (no text, no token
        id; runtime.engine.trace_recorder). `None` stops the recording and closes its file, as `close()` does.
        Returns the new recorder (its `written` counts lines), or None. A path that cannot be opened raises OSError;
        a write that fails later stops the recording with one warning, never a request. The file being recorded to,
        given again, starts over (trace_recorder.record_to)."""
        return record_to(self._loop, path, self.cache.page_size, self.fingerprint)  # one writer per file at a time

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is in flight and the engine's loop thread has exited (False on timeout).

        An engine still running at interpreter exit is closed then (engine.exit_hook: a loop thread still inside
        torch as the interpreter finalises aborted the process), waiting at most `EXIT_WAIT_S` seconds.
        `timeout`: as `close`'s (a string failed inside the wait).
        """
        return self._loop.wait_idle(wait_bound(timeout))

    def check(self, timeout: float | None = 30.0) -> dict[str, int]:
        """Check the cache's invariants between two steps (on the loop thread) and return its block gauges and
        queue lengths. Raises the cache's InvariantError if one is broken (a bug)."""

        def gauges(s: Scheduler) -> dict[str, int]:
            self.kv.leases.expire()  # a lease past its deadline holds nothing, even on an idle engine
            return checked_gauges(self.cache, s, self.kv, self.tiers)

        return self._loop.wait_for(gauges, wait_bound(timeout))  # NaN was a TimeoutError with no message

    def check_alive(self, stall_s: float | None = None) -> None:
        """Raise EngineDeadError (naming the original error) if the loop thread has died, as every later call would;
        asks nothing of the loop, so a busy one answers at once (a replica's liveness check, runtime.cluster). With
        `stall_s`, EngineStalledError (an EngineDeadError) when the loop has work and has not turned (finished a step
        or run a command) for `stall_s` seconds: a step that never returns (a hung kernel, a stuck file system under
        it), where every request would wait for ever; a step's length (a long prompt's prefill chunk) must stay under
        it."""
        loop = self._loop
        loop.check_alive()
        if stall_s is not None and not loop.idle() and (still := time.monotonic() - loop.beat) >= stall_s:
            raise EngineStalledError(TimeoutError(f"no progress for {still:.1f} s with work to do"))

    def clear_retention(self) -> int:
        """Forget every retention mark (leaves re-rank as they are next touched). Returns how many there were."""
        return self._loop.wait_for(lambda _: self.retention.clear())

    @property
    def stats(self) -> EngineStats:
        return engine_stats(self.output.totals, self.scheduler, self.kv, self.tiers, self.thread_control)

    def __repr__(self) -> str:
        return f"Engine(model={self.config.name!r}, cache={self.cache!r}, enable_cache={self.enable_cache})"
