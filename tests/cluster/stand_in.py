"""A stand-in for the `ray` module, so the cluster's front door (runtime.cluster) runs its error paths without Ray:
its actors answer, time out, die or stop streaming on demand, in this process.

- `FakeActor.fail[method]`: an exception that the method's next `ray.get` raises (a Ray actor error, a timeout).
- `FakeActor.script(prompt, options)`: the items a `stream` call sends, in order: ("tokens", ids, logprobs),
  ("done", result, None), or an exception (the stream's next `ray.get` raises it, as Ray relays an actor's death or,
  wrapped in RayTaskError, an engine error), or a callable, run when the stream reaches it (a pause). A stream whose
  script ends without "done" stalls: it never sends again (a replica that stopped mid-stream).
- `ray.wait([stream], timeout)` waits up to `timeout` for the stream's next item, as Ray's does, and `ray.wait` of
  answers up to `timeout` for the first of them; `ray.get` of a `concurrent.futures.Future` (an answer a method
  returns to come later, or never) waits up to its timeout.
"""

from __future__ import annotations

import queue
import sys
import types
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait
from typing import Any

from radixcache.runtime.engine.request import GenerationResult


class RayActorError(Exception):
    pass


class ActorUnavailableError(Exception):
    pass


class GetTimeoutError(Exception):
    pass


class RayTaskError(Exception):
    """An exception the actor's method raised, as Ray wraps it: `as_instanceof_cause` gives the original back."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause

    def as_instanceof_cause(self) -> BaseException:
        return self.cause


class FakeStream:
    """A Ray streaming generator: its items come from a queue; `next` hands the next one (an item or an
    exception, which `ray.get` then raises)."""

    def __init__(self, items: list[Any]) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._peeked: list[Any] = []
        for item in items:
            self._queue.put(item)

    def wait(self, timeout: float | None) -> bool:
        if self._peeked:
            return True
        try:
            item = self._queue.get(timeout=timeout)
            while callable(item):  # a pause in the stream (say, a sleep), run when the stream reaches it
                item()
                item = self._queue.get(timeout=timeout)
            self._peeked.append(item)
        except queue.Empty:
            return False
        return True

    def __iter__(self) -> FakeStream:
        return self

    def __next__(self) -> Any:
        self.wait(None)
        return self._peeked.pop()


def result_for(prompt: list[int], tokens: list[int], finish: str = "length") -> GenerationResult:
    return GenerationResult("", tuple(tokens), len(prompt), 0, len(prompt), 0.01, 0.02, finish)


def echo_script(prompt: list[int], options: Any) -> list[Any]:
    """A healthy replica: the prompt's last token, max_new_tokens times, in two items, then the result."""
    tokens = [prompt[-1]] * options.max_new_tokens
    half = len(tokens) // 2
    items: list[Any] = [("tokens", part, [None] * len(part)) for part in (tokens[:half], tokens[half:]) if part]
    return [*items, ("done", result_for(prompt, tokens), None)]


class _Method:
    def __init__(self, actor: FakeActor, name: str) -> None:
        self.actor, self.name = actor, name

    def options(self, **_: Any) -> _Method:
        return self

    def remote(self, *args: Any) -> Any:
        fail = self.actor.fail.get(self.name)
        if fail is not None:
            return fail  # ray.get raises it
        return getattr(self.actor, "_" + self.name)(*args)


class FakeActor:
    """An EngineReplica's answers (see the module docstring)."""

    def __init__(self, replica: int, *_: Any) -> None:
        self.replica = replica
        self.fail: dict[str, BaseException] = {}
        self.batches: list | None = []
        self.script: Callable[[list[int], Any], list[Any]] = echo_script
        self.cancels: list[str] = []
        self.streams: list[str] = []

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    def _info(self) -> dict[str, Any]:
        info = {"fingerprint": "f" * 16, "page_size": 4, "capacity_blocks": 64, "policy": "lru", "model": "fake"}
        info["max_position"] = 4096
        return {**info, "incarnation": f"i{self.replica}", "pid": 0}

    def _check_alive(self, stall_s: float | None = None) -> None:
        """A live replica's engine loop lives (set `fail["check_alive"]` for one whose loop died)."""
        return None

    def _events_since(self, seq: int) -> tuple[str, list | None]:
        return f"i{self.replica}", self.batches

    def _snapshot(self) -> tuple[str, int, frozenset[bytes]]:
        return f"i{self.replica}", 0, frozenset()

    def _generate(
        self, prompt: list[int], max_new: int, kwargs: dict[str, Any], rid: str | None = None, *_: Any
    ) -> str:
        return f"done on {self.replica}"

    def _stream(self, rid: str, prompt: list[int], options: Any, *_: Any) -> FakeStream:
        self.streams.append(rid)
        return FakeStream(self.script(list(prompt), options))

    def _stats(self) -> types.SimpleNamespace:
        """What `ClusterEngine.per_replica` reads of an EngineStats: numbers that name this replica."""
        return types.SimpleNamespace(prompt_tokens=100 + self.replica, cached_tokens=10 + self.replica, hit_rate=0.5)

    def _counted_stats(self) -> tuple[str, types.SimpleNamespace]:
        return f"i{self.replica}", self._stats()

    def _check(self, timeout: float | None = None) -> dict[str, int]:
        """What `Engine.check` returns: the cache's block gauges (nothing held)."""
        return {"used_blocks": 0}

    def _close(self, timeout: float | None = None) -> bool:
        return True

    def _unpin(self, *_: Any) -> int:
        return 0

    def _flush(self, timeout: float | None = None) -> bool:
        return True

    def _cancel(self, rid: str) -> bool:
        self.cancels.append(rid)
        return True


def fake_ray() -> types.ModuleType:
    ray = types.ModuleType("ray")
    ray.exceptions = types.SimpleNamespace(  # type: ignore[attr-defined]
        RayActorError=RayActorError,
        ActorUnavailableError=ActorUnavailableError,
        GetTimeoutError=GetTimeoutError,
        RayTaskError=RayTaskError,
    )
    ray.is_initialized = lambda: True  # type: ignore[attr-defined]
    ray.cluster_resources = lambda: {"CPU": 64.0}  # type: ignore[attr-defined]
    ray.nodes = lambda: [{"Alive": True, "Resources": ray.cluster_resources()}]  # type: ignore[attr-defined]

    def get(ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, list):
            return [get(r) for r in ref]
        if isinstance(ref, BaseException):
            raise ref
        if isinstance(ref, Future):  # an answer still to come (a replica that answers late, or never)
            try:
                return ref.result(timeout)
            except FutureTimeout:
                raise GetTimeoutError() from None
        return ref

    def wait(refs: list[Any], timeout: float | None = None, **_: Any) -> tuple[list[Any], list[Any]]:
        if refs and all(isinstance(r, Future) and not r.done() for r in refs):  # answers to come: up to `timeout`
            futures_wait(refs, timeout, return_when=FIRST_COMPLETED)
        ready = [
            r for r in refs if (r.done() if isinstance(r, Future) else not isinstance(r, FakeStream) or r.wait(timeout))
        ]
        return ready, [r for r in refs if not any(r is x for x in ready)]

    ray.get = get  # type: ignore[attr-defined]
    ray.wait = wait  # type: ignore[attr-defined]
    ray.kill = lambda actor, no_restart=True: None  # type: ignore[attr-defined]
    factory = types.SimpleNamespace(options=lambda **_: types.SimpleNamespace(remote=FakeActor))
    ray.remote = lambda cls=None, **_: factory if cls is not None else lambda _cls: factory  # type: ignore[attr-defined]
    return ray


def install(monkeypatch: Any) -> types.ModuleType:
    """Put the stand-in in `sys.modules["ray"]` for one test (the cluster imports `ray` when it starts)."""
    ray = fake_ray()
    monkeypatch.setitem(sys.modules, "ray", ray)
    return ray


def freeze_generate(actor: FakeActor) -> tuple[list[tuple[Any, ...]], Future[Any]]:
    """Make `actor`'s blocking generate never answer (a frozen replica): the list each call's extra arguments (its
    request name, the seconds spent) are appended to, and the future every call returns (set it to let them go)."""
    never: Future[Any] = Future()
    names: list[tuple[Any, ...]] = []

    def generate(prompt: list[int], max_new: int, kwargs: dict[str, Any], *name: Any) -> Future[Any]:
        names.append(name)
        return never

    actor._generate = generate  # type: ignore[method-assign]
    return names, never
