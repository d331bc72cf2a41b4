"""An in-process stand-in for the `ray` module that runs the real replica class (runtime.cluster.replica) as actors in
this process: every method call runs on a thread pool, a streaming call runs its generator on a thread of its own,
and errors reach the caller as Ray relays them (an actor's exception wrapped in RayTaskError, whose
`as_instanceof_cause` gives it back; a killed actor's calls and streams fail with RayActorError). So the front door
(runtime.cluster: ReplicaCluster and ClusterEngine) runs over real engines without Ray, fast enough for the fault
harness. Not a model of Ray's scheduling: each actor takes any number of concurrent calls. With `pickled=True`, a
method's arguments, its result and each item it streams cross by a pickle round trip, as Ray copies them between
processes (plain pickle: stricter than Ray's cloudpickle, which also takes lambdas and local classes by value).
"""

from __future__ import annotations

import pickle
import queue
import sys
import threading
import types
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as futures_wait
from typing import Any

from tests.cluster.stand_in import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

_END = object()


class _Failed:
    """A call on a dead actor: `ray.get` raises its error."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Item:
    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error


class Stream:
    """A streaming call: the generator runs on its own thread; `wait`/`next` as Ray's ObjectRefGenerator."""

    def __init__(self, make: Any, dead: BaseException | None = None) -> None:
        """`dead`: a call on a dead actor, whose first item raises it (as Ray's generator does)."""
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._peeked: list[Any] = []
        if dead is not None:
            self._queue.put(_Item(error=dead))
            self._queue.put(_END)
            return
        threading.Thread(target=self._run, args=(make,), daemon=True).start()

    def _run(self, make: Any) -> None:
        try:
            for item in make():
                self._queue.put(_Item(item))
        except BaseException as exc:  # the actor's error is the stream's next item
            self._queue.put(_Item(error=RayTaskError(exc)))
        self._queue.put(_END)

    def fail(self, error: BaseException) -> None:
        self._queue.put(_Item(error=error))

    def wait(self, timeout: float | None) -> bool:
        if self._peeked:
            return True
        try:
            self._peeked.append(self._queue.get(timeout=timeout))
        except queue.Empty:
            return False
        return True

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Any:
        self.wait(None)
        item = self._peeked.pop()
        if item is _END:
            raise StopIteration
        return item


def _copied(value: Any) -> Any:
    """`value` after a pickle round trip: what a process on the other side of Ray gets."""
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _copying(method: Any) -> Any:
    """`method` with its arguments and result copied as Ray copies them."""

    def call(*args: Any) -> Any:
        return _copied(method(*_copied(args)))

    return call


def _copying_stream(method: Any) -> Any:
    """A streaming `method` with its arguments and each item copied as Ray copies them."""

    def call(*args: Any) -> Any:
        for item in method(*_copied(args)):
            yield _copied(item)

    return call


class Actor:
    def __init__(self, obj: Any, pool: ThreadPoolExecutor, pickled: bool = False) -> None:
        self.obj, self.pool, self.pickled = obj, pool, pickled
        self.dead = False
        self.streams: list[Stream] = []

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)


class _Method:
    def __init__(self, actor: Actor, name: str, streaming: bool = False) -> None:
        self.actor, self.name, self.streaming = actor, name, streaming

    def options(self, num_returns: Any = None, **_: Any) -> _Method:
        return _Method(self.actor, self.name, num_returns == "streaming")

    def remote(self, *args: Any) -> Any:
        actor = self.actor
        if actor.dead:
            error = RayActorError(f"the actor is dead (calling {self.name})")
            return Stream(None, error) if self.streaming else _Failed(error)
        method = getattr(actor.obj, self.name)
        if actor.pickled:
            method = (_copying_stream if self.streaming else _copying)(method)
        if self.streaming:
            stream = Stream(lambda: method(*args))
            actor.streams.append(stream)
            return stream
        return actor.pool.submit(method, *args)


def make_ray(workers: int = 64, pickled: bool = False) -> types.ModuleType:
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
    pool = ThreadPoolExecutor(workers, thread_name_prefix="inproc-ray")
    ray.actors = []  # type: ignore[attr-defined]

    def get(ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, list):
            return [get(r, timeout) for r in ref]
        if isinstance(ref, _Failed):
            raise ref.error
        if isinstance(ref, _Item):
            if ref.error is not None:
                raise ref.error
            return ref.value
        assert isinstance(ref, Future)
        try:
            return ref.result(timeout)
        except FutureTimeout:
            raise GetTimeoutError("timed out") from None
        except Exception as exc:
            raise RayTaskError(exc) from None

    def wait(refs: list[Any], timeout: float | None = None, **_: Any) -> tuple[list[Any], list[Any]]:
        if refs and all(isinstance(r, Future) and not r.done() for r in refs):  # calls still running: the first
            futures_wait(refs, timeout, return_when=FIRST_COMPLETED)
        ready = [
            r for r in refs if (r.done() if isinstance(r, Future) else not isinstance(r, Stream) or r.wait(timeout))
        ]
        return ready, [r for r in refs if not any(r is x for x in ready)]

    def kill(actor: Actor, no_restart: bool = True) -> None:
        actor.dead = True
        for stream in actor.streams:
            stream.fail(RayActorError("the actor was killed"))

    def remote(cls: type | None = None, **_: Any) -> Any:  # ray.remote(cls), or ray.remote(**options)(cls)
        if cls is None:
            return remote

        def create(*args: Any) -> Actor:
            actor = Actor(cls(*args), pool, pickled)
            ray.actors.append(actor)  # type: ignore[attr-defined]
            return actor

        return types.SimpleNamespace(options=lambda **_: types.SimpleNamespace(remote=create))

    ray.get, ray.wait, ray.kill, ray.remote = get, wait, kill, remote  # type: ignore[attr-defined]
    return ray


def install(monkeypatch: Any, pickled: bool = False) -> types.ModuleType:
    """Put the in-process stand-in in `sys.modules["ray"]` for one test (`pickled`: see the module's docstring)."""
    ray = make_ray(pickled=pickled)
    monkeypatch.setitem(sys.modules, "ray", ray)
    return ray
