"""Submission: the layer of `Engine` (engine.engine) between its public calls and the loop thread.

A call's options are resolved once (`_options`: engine.options' `resolve_options`, errors naming `Engine.<call>`),
its prompts built into validated requests (`_build`: engine.request_builder), and the requests handed to the loop
all or none (`_enqueue`: the `max_queue` gate of engine.queue_limit, one deadline per call); a group's requests
(`_submit_group`: n samples, fork branches) have their `cached_tokens` capped at what the tree held before the call,
on the loop thread; `_wait` waits for results and cancels the call's other requests when one wait raises.

Invariants: every request of a call is validated before any is queued; a closed engine refuses a call before any
work (EngineClosedError); a dead loop refuses it before the queue counts it (EngineDeadError).
"""

from __future__ import annotations

from typing import Any

from radixcache.runtime.engine.errors import EngineClosedError
from radixcache.runtime.engine.loop import EngineLoop, RequestHandle
from radixcache.runtime.engine.options import RequestOptions, resolve_options
from radixcache.runtime.engine.queue_limit import QueueGate
from radixcache.runtime.engine.request import GenerationResult, Request, check_unsubmitted
from radixcache.runtime.engine.request_builder import MaxNew, Prompt, RequestBuilder
from radixcache.runtime.engine.scheduler import Scheduler
from radixcache.runtime.kv.manager import KVManager


class Submission:
    """Options, builds, the queue and the waits of the engine's calls (set up in Engine.__init__)."""

    kv: KVManager
    queue: QueueGate
    queue_timeout: float | None
    _builder: RequestBuilder
    _loop: EngineLoop
    _closed: bool

    def _request(self, prompt: Prompt, max_new_tokens: MaxNew = None, options: Any = None, **kwargs: Any) -> Request:
        """A validated Request from generate's arguments; raises before anything is queued (closed: refused)."""
        return self._builder.build(prompt, self._options(max_new_tokens, options, kwargs, "generate"))

    def _options(
        self, max_new_tokens: int | None, options: RequestOptions | None, kwargs: dict[str, Any], caller: str
    ) -> RequestOptions:
        """The RequestOptions of a call (options.resolve_options; an unknown keyword is a TypeError naming
        `Engine.<caller>`). Raises EngineClosedError once the engine is closed, before any work."""
        if self._closed:
            raise EngineClosedError("this engine is closed")
        return resolve_options(max_new_tokens, options, kwargs, f"Engine.{caller}")

    def _build(self, prompts: list, options: list, pin_for: Any = None, what: str = "prompts") -> list[Request]:
        if self._closed:  # the requests of one call, all validated; an error of one of several names it: `what[i]`
            raise EngineClosedError("this engine is closed")
        return self._builder.build_all(prompts, options, pin_for, what)

    def _submit_group(self, reqs: list[Request]) -> list[RequestHandle]:
        if not reqs:
            return []

        def cap_at_what_is_cached(_: Scheduler) -> None:  # on the loop thread, just before they are added
            for r in reqs:  # admission reports min(its match, what the tree held of its own prompt before the call)
                r.kv.cached_cap = self.kv.peek(r.prompt_ids, r.namespace)[0]

        return self._enqueue(reqs, cap_at_what_is_cached)

    def _enqueue(self, reqs: list[Request], prepare: Any = None) -> list[RequestHandle]:
        """Hand prepared requests to the loop, all or none: QueueFullError (nothing queued) past `max_queue`."""
        self._loop.check_alive()  # EngineDeadError, before the queue counts them
        check_unsubmitted(reqs)
        self.queue.enter(reqs, self.queue_timeout)  # one deadline for the call's requests (queue_limit)
        return self._loop.submit_many(reqs, prepare)

    def _wait(self, handles: list[RequestHandle]) -> list[GenerationResult]:
        try:
            return [h.result() for h in handles]
        except BaseException:
            for h in handles:
                if not h.done():
                    h.cancel()
            raise
