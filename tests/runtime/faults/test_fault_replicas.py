"""Fault injection with replicas on: the harness's eight mixed requests (harness.workload: greedy, sampled, penalised,
logprobs, stop strings, a pin, a fork of two, shared prefixes, two arriving while the others run) go through the
cluster's front door (ClusterEngine over ReplicaCluster) to two replica engines, run in this process by an
in-process stand-in for Ray (tests/cluster/inproc_ray.py: the real replica class, Ray's error relaying). A fault
raised at one stage of one request, inside its replica's engine or in the front door's relay of its tokens, fails
that request alone, with the injected error; every other output equals the single-engine clean run's; both replicas'
caches keep their invariants and hold no block; the front door's loads are released.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from radixcache.runtime.testing import RandomModel, hold_engine_loop
from tests.runtime.faults.conftest import assert_clean
from tests.runtime.faults.harness import (
    MAX_NEW,
    Fault,
    Injected,
    Injector,
    Outcome,
    fault_engine,
    run_workload,
    workload,
)

ENGINE = {
    "capacity_blocks": 96,
    "page_size": 4,
    "dtype": "float64",
    "max_prefill_tokens": 24,
    "mixed_prefill_tokens": 8,
    "prefill_chunk": 12,
    "max_pinned_fraction": 0.25,
}
STAGES = (
    "admission",
    "commit",
    "forward",
    "pin",
    "decode_growth",
    "emit",
    "sampling",
    "penalties",
    "logprobs",
    "stop_strings",
    "detokenize",
    "event_publish",
    "result",
    "listener",  # the front door's relay of a request's tokens to its caller
)
PER_TOKEN = ("sampling", "penalties", "emit", "detokenize")  # runs fixed by the request itself, not by batching


@pytest.fixture
def front(tiny: RandomModel, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from tests.cluster.inproc_ray import install

    ray = install(monkeypatch)
    from radixcache.runtime import loading
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    monkeypatch.setattr(loading, "load_config_and_tokenizer", lambda model: (model.config, model.tokenizer))
    threads = torch.get_num_threads()
    cluster = ReplicaCluster(tiny, 2, router="round_robin", engine_kwargs=ENGINE, poll_interval=None)  # type: ignore[arg-type]
    engine = ClusterEngine(cluster, tiny)  # type: ignore[arg-type]
    engine.replicas = [actor.obj for actor in ray.actors]  # the EngineReplica objects
    try:
        yield engine
    finally:
        engine.close()
        for replica in engine.replicas:
            replica.engine.close()
        torch.set_num_threads(threads)  # a replica sets its own count


def run_on_replicas(front: Any, fault: Fault | None) -> Outcome:
    """The harness's eight requests through `front`, with `fault` injected in the replicas' engines (or, for
    "listener", in the front door's relay)."""
    out = Outcome()
    injector = Injector(fault, out)
    specs = workload()
    by_key = {(tuple(p), o.get("seed")): i for i, (p, o) in enumerate(specs)}
    for replica in front.replicas:
        index: dict[int, int] = {}
        injector.instrument(replica.engine, index)
        real_submit = replica.engine.submit

        def submit(
            prompt: Any, *a: Any, _real: Any = real_submit, _index: Any = index, _engine: Any = replica.engine, **k: Any
        ) -> Any:
            # the replica's loop waits while the request is submitted and indexed: free, it could admit the request
            # before `watch` maps its id, and a fault at admission would then never fire
            release = hold_engine_loop(_engine)
            try:
                handle = _real(prompt, *a, **k)
                i = by_key[(tuple(prompt), handle.request.sampler.params.seed)]
                injector.watch(handle, i, _index, listener=False)  # the replica's own listener wakes its stream
            finally:
                release()
            return handle

        replica.engine.submit = submit
    handles: dict[int, Any] = {}

    def watch(i: int, handle: Any) -> None:
        handles[i] = handle
        handle.request.listener = lambda r: injector.hit("listener", i)

    with injector:
        for i in range(4):
            prompt, options = specs[i]
            watch(i, front.submit(prompt, MAX_NEW, ignore_eos=True, **options))
        fork = front.submit_group(
            [specs[4][0]] * 2, MAX_NEW, ignore_eos=True, temperature=0.7, each=[{"seed": 3}, {"seed": 4}]
        )
        for n, h in enumerate(fork):
            watch(4 + n, h)
        started = threading.Event()
        while not started.wait(0.005):  # the second wave arrives while the first prefill and decode
            if any(h.request.output_ids for h in handles.values()) or all(h.done() for h in handles.values()):
                started.set()
        for i in (6, 7):
            prompt, options = specs[i]
            watch(i, front.submit(prompt, MAX_NEW, ignore_eos=True, **options))
        for i, h in sorted(handles.items()):
            try:
                out.tokens[i] = h.result(60).token_ids
            except Exception as exc:
                out.errors[i] = exc
    return out


@pytest.fixture(scope="module")
def clean(tiny: RandomModel) -> Outcome:
    """The single-engine clean run: the outputs every replica run must give, and which requests run each stage."""
    with fault_engine(tiny) as engine:
        out = run_workload(engine, None)
    assert not out.errors and len(out.tokens) == 8
    return out


def _check(front: Any, out: Outcome, clean: dict[int, tuple[int, ...]], fault: Fault | None) -> None:
    if fault is None:
        assert not out.errors and out.tokens == clean  # replicas change no output (float64: batching neither)
    else:
        assert out.fired, fault
        assert set(out.errors) == {fault.victim}, out.errors
        assert all(isinstance(e, Injected) for e in out.errors.values()), out.errors
        assert out.tokens == {i: t for i, t in clean.items() if i != fault.victim}
    for replica in front.replicas:
        replica.engine.unpin()
        assert_clean(replica.engine)
        assert replica.engine.cache.locked_blocks == 0 and not replica._handles
    assert front.cluster.loads.in_flight() == 0 and front.cluster.alive == (0, 1)


def test_replicas_serve_the_workload_as_one_engine_does(front: Any, clean: Outcome) -> None:
    _check(front, run_on_replicas(front, None), clean.tokens, None)


@pytest.mark.parametrize("stage", STAGES)
def test_a_fault_on_a_replica_fails_only_the_request_that_owns_it(front: Any, clean: Outcome, stage: str) -> None:
    rng = random.Random(f"replicas/{stage}")
    victim = rng.choice([i for i in range(8) if clean.counts[(stage, i)] > 0])
    # A random one of the first half of its runs where the request itself fixes the count (one per token); the
    # first run where the replicas' batching does (commits, event batches, relayed token batches).
    runs = clean.counts[(stage, victim)]
    at = rng.randint(2, max(2, runs // 2)) if stage in PER_TOKEN and runs >= 2 else 1
    fault = Fault(stage, victim, at)
    _check(front, run_on_replicas(front, fault), clean.tokens, fault)
