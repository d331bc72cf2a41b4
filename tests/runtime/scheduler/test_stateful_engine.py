"""A hypothesis state machine over one engine's scheduler, driven step by step in the orders real traffic makes:
requests arriving while others prefill or decode, identical prompts in the same step, prompts exactly on page
boundaries, one-token outputs, bursts into a nearly full pool (preemption), cancels at any instant, a cached prefix
evicted while its request waits, and faults owned by one request (its forward pass, its sampling step, its commit,
its next page, its listener). After every rule the radix cache's invariants hold, every block held belongs to a
running request, every lock on the tree is one running request's, and each running request's block table follows
the tree. At the end nothing is held, and every request that was neither cancelled nor faulted produced the greedy
tokens of an uncached engine running it alone (a prefix of them when it alone outgrew the pool)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixcache import CacheFullError
from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import RequestTooLargeError
from radixcache.runtime.engine.request import Request
from radixcache.runtime.engine.scheduler import SCHEDULES, SchedulerConfig
from radixcache.runtime.kv.state import Status
from radixcache.runtime.testing import tiny_model

from .conftest import ids

MODEL = tiny_model(seed=11)
ROOTS = [ids(48, 500 + i) for i in range(3)]
STAGES = ("forward", "emit", "commit", "reserve", "listener")
_ALONE: dict[tuple[int, tuple[int, ...], int], tuple[int, ...]] = {}


class Injected(RuntimeError):
    """The fault a doomed request's stage raises."""


def alone(page: int, prompt: list[int], n: int) -> tuple[int, ...]:
    """The greedy tokens of `prompt` on an uncached engine with room to spare, run alone (memoised)."""
    key = (page, tuple(prompt), n)
    if key not in _ALONE:
        e = Engine(MODEL, capacity_blocks=256 // page + 8, page_size=page, enable_cache=False, dtype="float64")
        req = e._request(prompt, n, ignore_eos=True)
        e.scheduler.add(req)
        with torch.inference_mode():
            while e.scheduler.has_work():
                e.scheduler.step()
        assert req.error is None
        _ALONE[key] = tuple(req.output_ids)
    return _ALONE[key]


class EngineOrders(RuleBasedStateMachine):
    @initialize(
        page=st.sampled_from([1, 2, 16]),
        spare=st.integers(0, 3),
        schedule=st.sampled_from(SCHEDULES),
        share=st.booleans(),
        prefill=st.sampled_from([3, 16, 256]),
        mixed=st.sampled_from([1, 5, 24]),
        max_running=st.sampled_from([2, 3, 16]),
        staged=st.sampled_from([None, None, 64]),
    )
    def setup(
        self, page: int, spare: int, schedule: str, share: bool, prefill: int, mixed: int, max_running: int, staged: Any
    ) -> None:
        self.page = page
        longest = 40 + 8  # the longest prompt and output
        self.capacity = -(-longest // page) + spare  # from "the longest request just fits" to a little room
        cfg = SchedulerConfig(
            schedule=schedule,
            share_in_flight=share,
            max_prefill_tokens=prefill,
            mixed_prefill_tokens=mixed,
            max_running=max_running,
            staged_prefill_attention=staged,
            prefill_chunk=max(2, prefill // 2),
            max_wait_s=float("inf"),  # the starvation guard by steps only: a replay must not depend on the clock
        )
        self.now = 0.0  # the leases' clock, moved by `time_passes`
        self.engine = Engine(
            MODEL,
            capacity_blocks=self.capacity,
            page_size=page,
            scheduler_config=cfg,
            dtype="float64",
            lease_clock=lambda: self.now,
        )
        self.s = self.engine.scheduler
        self.reqs: list[Request] = []
        self.cancelled: set[int] = set()
        self.doomed: dict[int, str] = {}  # rid -> the stage that raises for it
        self.fired: set[int] = set()
        self.pinned = False  # a pin was asked for: pinned pages may have crowded a request out
        self._instrument()

    # ------------------------------------------------------------------ faults owned by one request

    def _hit(self, stage: str, rid: int) -> None:
        if self.doomed.get(rid) == stage:
            self.fired.add(rid)
            raise Injected(f"{stage} of request {rid}")

    def _instrument(self) -> None:
        kv, output, runner = self.engine.kv, self.engine.output, self.engine.runner
        real_step, real_emit, real_commit, real_reserve = runner.step, output.emit, kv.commit, kv.reserve

        def step(decodes: list[Request], chunks: list[tuple[Request, int]]) -> Any:
            for r in [*decodes, *(r for r, _ in chunks)]:
                self._hit("forward", r.rid)
            return real_step(decodes, chunks)

        def emit(req: Request, *a: Any, **k: Any) -> Any:
            self._hit("emit", req.rid)
            return real_emit(req, *a, **k)

        def commit(state: Any, *a: Any, **k: Any) -> Any:
            self._hit("commit", state.rid)
            return real_commit(state, *a, **k)

        def reserve(state: Any, *a: Any, **k: Any) -> Any:
            self._hit("reserve", state.rid)
            return real_reserve(state, *a, **k)

        runner.step, output.emit, kv.commit, kv.reserve = step, emit, commit, reserve  # type: ignore[method-assign]

    # ------------------------------------------------------------------ rules

    @rule(
        root=st.integers(0, len(ROOTS) - 1),
        length=st.integers(1, 40),
        on_page=st.booleans(),
        tail=st.integers(0, 6),
        n=st.sampled_from([1, 1, 2, 5, 8]),
        priority=st.sampled_from([0, 0, 1]),
        namespace=st.sampled_from([None, None, "b"]),
        copies=st.sampled_from([1, 1, 2, 3]),
        keep=st.sampled_from(["", "", "", "pin", "lease"]),
    )
    def arrive(
        self,
        root: int,
        length: int,
        on_page: bool,
        tail: int,
        n: int,
        priority: int,
        namespace: Any,
        copies: int,
        keep: str,
    ) -> None:
        """Requests arrive between two steps (identical copies in the same step)."""
        prompt = ROOTS[root][:length] + ids(tail, 31 * length + tail)[:tail] if tail else ROOTS[root][:length]
        if on_page:  # exactly on a page boundary
            prompt = prompt[: max(self.page, len(prompt) // self.page * self.page)]
            prompt = (prompt + ROOTS[(root + 1) % 3])[: max(self.page, len(prompt))]
        prompt = prompt[:40]
        for _ in range(copies):
            extra: dict[str, Any] = {"pin": True} if keep == "pin" else {"retain_for": 5.0} if keep == "lease" else {}
            self.pinned = self.pinned or keep == "pin"
            try:
                req = self.engine._request(prompt, n, ignore_eos=True, namespace=namespace, priority=priority, **extra)
            except ValueError:  # a pin larger than the pinned share: refused at the door
                assert keep == "pin"
                continue
            try:
                self.s.add(req)
            except RequestTooLargeError:  # pragma: no cover - every prompt fits the pool alone
                raise AssertionError("a prompt that fits the pool was refused") from None
            self.reqs.append(req)

    @rule(k=st.integers(1, 4))
    def steps(self, k: int) -> None:
        with torch.inference_mode():
            for _ in range(k):
                if self.s.has_work():
                    self.s.step()
                self.s.drain()

    @precondition(lambda self: any(r.t_finish is None for r in self.reqs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """A cancel at this instant, whatever the request's state (waiting, preempted, mid-chunk, decoding)."""
        live = [r for r in self.reqs if r.t_finish is None]
        r = data.draw(st.sampled_from(live))
        if self.s.abort(r, "cancelled"):
            self.cancelled.add(r.rid)
        self.s.drain()

    @precondition(lambda self: any(r.t_finish is None for r in self.reqs))
    @rule(data=st.data(), stage=st.sampled_from(STAGES))
    def doom(self, data: st.DataObject, stage: str) -> None:
        """From now on, one stage of one live request raises (for it alone)."""
        live = [r for r in self.reqs if r.t_finish is None and r.rid not in self.doomed]
        if not live:
            return
        r = data.draw(st.sampled_from(live))
        self.doomed[r.rid] = stage
        if stage == "listener":

            def listener(req: Request) -> None:
                self._hit("listener", req.rid)

            r.listener = listener

    @rule(cap=st.sampled_from([None, None, 1, 4]))
    def busy_cpu(self, cap: int | None) -> None:
        """The loop's thread controller measuring a busy machine keeps each step's prefill short (threads.py)."""
        self.s.prefill_cap = cap

    @rule(seconds=st.sampled_from([1.0, 6.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def unpin_everything(self) -> None:
        self.engine.kv.pins.unpin(None, None, True)

    @rule()
    def evict_everything_evictable(self) -> None:
        """Memory pressure from outside: every unlocked cached page goes (a waiting request's prefix with them)."""
        self.engine.cache.evict(self.engine.cache.evictable_blocks)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def cache_is_consistent(self) -> None:
        if not hasattr(self, "engine"):
            return
        c, s = self.engine.cache, self.s
        c.check_invariants()
        running = s.running
        assert c.held_blocks == sum(len(r.kv.held_blocks) for r in running), "a held block no running request owns"
        for r in s.waiting:
            assert r.kv.status is Status.WAITING and not r.kv.block_table and r.kv.match_node is None
        locks = sum(n.own_locks for n in _nodes(c))
        mine = sum(1 for r in running if r.kv.match_node is not None and r.kv.match_node.parent is not None)
        kv = self.engine.kv
        held = mine + len(kv.pins) + len(kv.leases)
        assert locks == held, f"{locks} locks on the tree: {mine} of running requests, {len(kv.pins)} pins, leases"
        p = self.page
        for r in running:
            assert r.kv.status is Status.RUNNING
            t = r.kv.tree_blocks
            if t:
                node = r.kv.match_node
                assert node is not None
                blocks, keys = _path(node)
                assert r.kv.block_table[:t] == blocks[:t], f"request {r.rid}'s table left the tree"
                assert keys[: t * p] == r.all_ids[: t * p]
            assert len(r.kv.block_table) * p >= r.kv.num_kv
        for r in self.reqs:
            if r.t_finish is not None:
                assert r.kv.status in (Status.FINISHED, Status.ABORTED) and not r.kv.block_table

    def teardown(self) -> None:
        if not hasattr(self, "engine"):
            return
        s = self.s
        with torch.inference_mode():
            for _ in range(2000):
                if not s.has_work():
                    break
                s.step()
                s.drain()
                self.cache_is_consistent()
        assert not s.has_work(), "the requests never all finished"
        self.cache_is_consistent()
        self.engine.kv.pins.unpin(None, None, True)
        self.engine.kv.leases.clear()
        c = self.engine.cache
        c.check_invariants()
        assert c.held_blocks == 0 and c.locked_blocks == 0
        assert c.free_blocks + c.evictable_blocks == c.capacity_blocks
        for r in self.reqs:
            assert r.t_finish is not None
            if r.rid in self.cancelled:
                assert r.finish_reason == "cancelled"  # its listener, told of the cancel, may raise then
                assert r.error is None or (self.doomed.get(r.rid) == "listener" and isinstance(r.error, Injected))
                continue
            pinned = self.engine.max_pinned_blocks * self.page if self.pinned else 0  # what pins may have held
            if isinstance(r.error, CacheFullError) and not isinstance(r.error, Injected):  # beside pinned pages
                assert len(r.prompt_ids) + pinned > self.capacity * self.page, f"request {r.rid}: {r.error!r}"
                continue
            if r.error is not None:
                assert r.rid in self.fired and isinstance(r.error, Injected), f"request {r.rid} failed: {r.error!r}"
                continue
            assert r.rid not in self.fired, f"request {r.rid} survived its fault"
            want = alone(self.page, r.prompt_ids, r.params.max_new_tokens)
            got = tuple(r.output_ids)
            if len(got) < len(want):  # it alone outgrew the pool: "length", with what it made
                assert r.finish_reason == "length", (r.rid, got)
                assert r.num_tokens - 1 + pinned >= self.capacity * self.page, (r.rid, got)
            assert got == want[: len(got)], f"request {r.rid}: {got} != {want}"
        self.engine.close()


def _nodes(cache: Any) -> list[Any]:
    out, stack = [], list(cache._roots.values())
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out


def _path(node: Any) -> tuple[list[int], list[int]]:
    """The blocks and tokens from the root down to `node`."""
    parts = []
    while node.parent is not None:
        parts.append(node)
        node = node.parent
    parts.reverse()
    return [b for n in parts for b in n.blocks], [t for n in parts for t in n.key]


EngineOrders.TestCase.settings = settings(
    max_examples=20, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)
EngineOrders.TestCase.pytestmark = [pytest.mark.slow]  # 20 machines of 30 rules: ~1-3 min on 2 shared cores
test_engine_orders = EngineOrders.TestCase
