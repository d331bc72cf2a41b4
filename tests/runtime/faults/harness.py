"""A fault-injection harness for the engine: eight requests of mixed kinds (greedy, sampled, penalised, logprobs,
stop strings, a pin, a fork of two, prefix sharing, two arriving while the others prefill and decode) run on the tiny
model, with a fault raised at one stage of one request (its `victim`) at its k-th run of that stage.

`run_workload` returns each request's outcome (its token ids, or the error it failed with) and how many times each
stage ran for each request; a clean run (no fault) gives the expected outputs and the counts a seeded random fault
is drawn from (`draw_fault`).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from radixcache.runtime import Engine
from radixcache.runtime.engine import output as output_module
from radixcache.runtime.testing import RandomModel, hold_engine_loop

MAX_NEW = 10
WAVE_TWO_AT_STEP = 3  # the last two requests arrive at this step, while the first six prefill or decode


class Injected(RuntimeError):
    """The fault the harness raises."""


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 97) for _ in range(n)]


def workload() -> list[tuple[list[int], dict[str, Any]]]:
    """(prompt, options) of the eight requests, in submission order; 4 and 5 are one fork (submit_group), 6 and 7
    arrive at step WAVE_TWO_AT_STEP; 0, 1, 3, 4, 5 and 6 share a 24-token system prompt (6 extends 0's prompt)."""
    rng = random.Random(31)
    system = _ids(rng, 24)
    first = system + _ids(rng, 9)
    fork = system + _ids(rng, 6)
    return [
        (first, {}),
        (system + _ids(rng, 7), {"temperature": 0.9, "seed": 1, "repetition_penalty": 1.2}),
        (_ids(rng, 30), {"logprobs": 3, "presence_penalty": 0.5}),
        (system + _ids(rng, 11), {"stop": ["e", "t"], "frequency_penalty": 0.3}),
        (fork, {"temperature": 0.7, "seed": 3}),
        (fork, {"temperature": 0.7, "seed": 4}),
        (first + _ids(rng, 5), {"logit_bias": {7: 3.0}}),
        (_ids(rng, 16), {"pin": True, "frequency_penalty": 0.2}),
    ]


# stage -> the requests it runs for (None: every request)
STAGES: dict[str, tuple[int, ...] | None] = {
    "validation": (0, 1, 2, 3, 6, 7),  # the fork's two are validated as one call
    "admission": None,
    "commit": None,
    "forward": None,  # a pass that fails for this request's sake: it keeps failing (the retry alone too)
    "pin": (7,),
    "decode_growth": None,
    "emit": None,
    "sampling": None,  # every request whose row is not plain greedy
    "penalties": None,
    "logprobs": (2,),
    "stop_strings": (3,),
    "detokenize": None,
    "event_publish": None,
    "tier_copy": None,  # the KV manager's hand-off of adopted pages to the tiers (tiers.adopted)
    "host_copy": None,  # the device-to-host copy itself (HostKVPool.save): the tier contains it
    # A page read from the disk tier (a prefetch reader's, or at admission), after a restart. Only the requests whose
    # prompts share no page with another's: a shared page is read by whichever prefetch reaches it first, so how
    # many reads a sharer owns is timing (a loaded CI run drew a run the victim never reached).
    "disk_read": (2, 7),
    "result": None,
    "listener": None,
}


# Stages whose fault the tier code contains (the page is simply not cached there, or recomputed): the request that
# owns it may fail or finish, but no other request may fail.
CONTAINED = frozenset({"host_copy", "disk_read"})


@dataclass
class Fault:
    stage: str
    victim: int  # index in workload()
    at: int  # raise on the victim's at-th run of the stage (1-based)


@dataclass
class Outcome:
    tokens: dict[int, tuple[int, ...]] = field(default_factory=dict)
    errors: dict[int, BaseException] = field(default_factory=dict)
    counts: Counter[tuple[str, int]] = field(default_factory=Counter)
    fired: bool = False


def draw_fault(stage: str, clean: Outcome, rng: random.Random) -> Fault:
    """A victim the stage runs for, and a random one of its runs of that stage in the clean run."""
    allowed = STAGES[stage] if STAGES[stage] is not None else range(8)
    candidates = [i for i in allowed if clean.counts[(stage, i)] > 0]
    victim = rng.choice(candidates)
    return Fault(stage, victim, rng.randint(1, clean.counts[(stage, victim)]))


class Injector:
    """Counts each stage's runs per request (its workload index) and raises `fault` at its run. `instrument` wraps
    one engine's stages (several engines may share an injector: replicas); `watch` a request's own (its sampler
    and listener). Which request a stage runs for is read from its arguments, or, for stages called without one,
    from the request whose KV operation or output step runs now on this thread (each engine's loop thread keeps
    its own)."""

    def __init__(self, fault: Fault | None, out: Outcome) -> None:
        self.fault, self.out = fault, out
        self._local = threading.local()
        self.real_logprob, self.real_find_stop = output_module.token_logprob, output_module.find_stop

    def hit(self, stage: str, i: int | None) -> None:
        if i is None:
            return
        out, fault = self.out, self.fault
        out.counts[(stage, i)] += 1
        n = out.counts[(stage, i)]
        if (
            fault is not None
            and fault.stage == stage
            and fault.victim == i
            and (n == fault.at or (n > fault.at > 0 and stage == "forward"))
        ):
            out.fired = True
            raise Injected(f"{stage} of request {i}")

    def _current(self) -> list[int]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def now(self) -> int | None:
        current = self._current()
        return current[-1] if current and current[-1] >= 0 else None

    def wrap(self, owner: Any, name: str, stage: str | None, who: Callable[..., int | None]) -> None:
        real = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            i = who(*args, **kwargs)
            current = self._current()
            current.append(i if i is not None else -1)
            try:
                if stage is not None:
                    self.hit(stage, i)
                return real(*args, **kwargs)
            finally:
                current.pop()

        setattr(owner, name, wrapper)

    def instrument(self, engine: Engine, index: dict[int, int]) -> None:
        """Wrap `engine`'s stages; `index` maps its request ids to workload indexes (filled by the caller)."""
        by_rid, now, wrap = index.get, self.now, self.wrap
        kv, output = engine.kv, engine.output
        wrap(kv, "admit", "admission", lambda kvs, *a, **k: by_rid(kvs.rid))
        wrap(kv, "commit", "commit", lambda kvs, *a, **k: by_rid(kvs.rid))
        wrap(kv, "pin", "pin", lambda kvs, *a, **k: by_rid(kvs.rid))
        wrap(kv, "reserve", "decode_growth", lambda kvs, *a, **k: by_rid(kvs.rid))
        wrap(kv, "release", None, lambda kvs, *a, **k: by_rid(kvs.rid))
        wrap(kv, "preempt", None, lambda kvs, *a, **k: by_rid(kvs.rid))
        wrap(output, "emit", "emit", lambda req, *a, **k: by_rid(req.rid))
        wrap(engine._loop, "_finish", "result", lambda req, *a, **k: by_rid(req.rid))  # output.result, bound
        wrap(output, "text", "detokenize", lambda *a, **k: now())
        if engine.events is not None:
            wrap(engine.events, "stored", "event_publish", lambda *a, **k: now())
        if engine.tiers is not None:
            wrap(engine.tiers, "adopted", "tier_copy", lambda *a, **k: now())
            if engine.tiers.host_pool is not None:
                wrap(engine.tiers.host_pool, "save", "host_copy", lambda *a, **k: now())
            if engine.tiers.disk is not None and engine.tiers.reader is not None:
                self._instrument_disk_reads(engine.tiers, index)
        real_forward = engine.runner.step

        def forward(decodes: list[Any], chunks: list[Any]) -> Any:
            for r in [*decodes, *(r for r, _ in chunks)]:
                self.hit("forward", by_rid(r.rid))
            return real_forward(decodes, chunks)

        engine.runner.step = forward  # type: ignore[method-assign]

    def _instrument_disk_reads(self, tiers: Any, index: dict[int, int]) -> None:
        """Disk pages are read ahead by reader threads, per job (kv.tier.prefetch), or on the loop thread by a
        request that was not prefetched: a job's owner is the request whose `prefetch` submitted it."""
        owners: dict[int, int] = {}
        local = threading.local()
        real_prefetch, real_submit, real_read = tiers.prefetch, tiers.reader.submit, tiers.reader._read_into

        def prefetch(rid: int, *a: Any, **k: Any) -> Any:
            local.owner = index.get(rid)
            try:
                return real_prefetch(rid, *a, **k)
            finally:
                local.owner = None

        def submit(job: Any) -> Any:
            owner = getattr(local, "owner", None)
            if owner is not None:
                owners[id(job)] = owner
            return real_submit(job)

        def read_into(job: Any, i: int) -> Any:
            owner = owners.get(id(job))
            self.hit("disk_read", owner if owner is not None else self.now())
            return real_read(job, i)

        tiers.prefetch, tiers.reader.submit, tiers.reader._read_into = prefetch, submit, read_into

    def watch(self, handle: Any, i: int, index: dict[Any, int], listener: bool = True) -> None:
        """Request `i`'s own stages: its sampler's sample and process, and (if `listener`) its listener."""
        index[handle.rid] = i
        sampler = handle.request.sampler
        self.wrap(sampler, "sample", "sampling", lambda *a, **k: i)
        self.wrap(sampler, "process", "penalties", lambda *a, **k: i)
        if listener:
            handle.request.listener = lambda r: self.hit("listener", i)

    def __enter__(self) -> Injector:
        """The module-level output helpers (logprobs, stop strings) raise for the request that runs now."""

        def token_logprob(*a: Any, **k: Any) -> Any:
            self.hit("logprobs", self.now())
            return self.real_logprob(*a, **k)

        def find_stop(*a: Any, **k: Any) -> Any:
            self.hit("stop_strings", self.now())
            return self.real_find_stop(*a, **k)

        output_module.token_logprob, output_module.find_stop = token_logprob, find_stop  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        output_module.token_logprob = self.real_logprob  # type: ignore[assignment]
        output_module.find_stop = self.real_find_stop  # type: ignore[assignment]


def run_workload(engine: Engine, fault: Fault | None) -> Outcome:
    """Run the eight requests on `engine` with `fault` injected (None: a clean run); the engine is left as it is."""
    out = Outcome()
    index: dict[int, int] = {}  # rid -> workload index
    specs = workload()
    injector = Injector(fault, out)
    injector.instrument(engine, index)

    def watch(handle: Any, i: int) -> None:
        injector.watch(handle, i, index)

    def submit(i: int) -> Any:
        prompt, options = specs[i]
        if fault is not None and fault.stage == "validation" and fault.victim == i:
            out.fired = True
            raise Injected(f"validation of request {i}")
        out.counts[("validation", i)] += 1
        return engine.submit(prompt, MAX_NEW, ignore_eos=True, **options)

    handles: dict[int, Any] = {}

    def add(i: int, make: Callable[[], Any]) -> None:
        try:
            handles[i] = make()
        except Injected as exc:  # refused at the door: only this request
            out.errors[i] = exc
            return
        watch(handles[i], i)

    real_step, steps, wave_two = engine.scheduler.step, [0], threading.Event()

    def step() -> None:
        steps[0] += 1
        if steps[0] == WAVE_TWO_AT_STEP:
            add(6, lambda: submit(6))
            add(7, lambda: submit(7))
            wave_two.set()
        real_step()

    engine.scheduler.step = step  # type: ignore[method-assign]
    with injector:
        release = hold_engine_loop(engine)
        try:
            for i in range(4):
                add(i, lambda i=i: submit(i))
            fork = engine.submit_group(
                [specs[4][0]] * 2, MAX_NEW, ignore_eos=True, temperature=0.7, each=[{"seed": 3}, {"seed": 4}]
            )
            for n, h in enumerate(fork):
                handles[4 + n] = h
                watch(h, 4 + n)
        finally:
            release()
        assert wave_two.wait(60)
        for i, h in list(handles.items()):
            try:
                out.tokens[i] = h.result(60).token_ids
            except Exception as exc:
                out.errors[i] = exc
        assert engine.wait_idle(60)
    return out


def fault_engine(model: RandomModel, **tiers: Any) -> Engine:
    """The engine the harness runs on: float64 (a batch that changes with a failed request never flips a near-tie),
    4-token pages, chunked prefill, KV events on; `tiers`: host_kv_memory / cache_dir."""
    return Engine(
        model,
        capacity_blocks=96,
        page_size=4,
        dtype="float64",
        max_prefill_tokens=24,
        mixed_prefill_tokens=8,
        prefill_chunk=12,
        max_pinned_fraction=0.25,
        kv_events=True,
        load_back="always",  # a page found in a tier is always loaded (the tiny model recomputes faster)
        **tiers,
    )
