"""Continuous batching with a cache-aware order: the scheduler that drives the Engine's steps.

Each `step()` runs one batched decode for every running request, then spends a budget of prefill tokens
(chunked prefill) on admitted requests and on new admissions. Requests join and leave between steps.

- Order of admission (`schedule`): `fcfs` (arrival), `lpm` (longest cached prefix first) or `dfs-weight`
  (requests grouped by the cached subtree they hit, heaviest subtree first, so a shared prefix is computed once
  and then hit by the rest). Priority (`Request.priority`) comes before any of these. A starvation guard puts
  any request that has waited `max_wait_steps` steps or `max_wait_s` seconds first, in arrival order.
- In-batch sharing (cache-aware schedules): a waiting request that shares at least one uncached page with a
  request still being prefilled waits until that request's prompt is in the tree, then hits it.
- Admission is bounded by free + evictable blocks, keeping one page of headroom per running decode. When a
  decode needs a page and none can be evicted, the lowest-priority running request (newest first) is
  preempted: its computed KV goes to the tree, its blocks are released, and it is resumed later from the cache.
  Positions computed again are counted as `recomputed_tokens`, never as hits.
- A request whose prompt needs more pages than the whole pool is refused at `add` (CacheFullError). A request
  that alone cannot grow (every other request preempted) fails with CacheFullError; nothing deadlocks.
- `abort` (cancel or timeout) works in every state. Every path leaves `check_invariants()` true and no block
  held by a request that left.

The scheduler is single-threaded and owns the engine's cache while it runs: the engine loop thread calls it.
Tests may drive it directly, step by step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixcache.runtime.engine.request import Request, Status

from radixcache import CacheFullError, TreeNode
from radixcache.tokens import as_token_array, common_prefix_length

if TYPE_CHECKING:
    from radixcache.runtime.engine.engine import Engine

SCHEDULES = ("lpm", "fcfs", "dfs-weight")


class RequestTooLargeError(CacheFullError):
    """A request that can never fit: its prompt needs more pages than the whole KV pool."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """schedule: lpm | fcfs | dfs-weight. max_prefill_tokens: prefill budget per step (chunked prefill).
    max_running: most requests admitted at once (the decode batch). max_wait_steps / max_wait_s: starvation
    guard. in_batch_sharing: defer a request sharing an uncached prefix with one being prefilled (cache-aware
    schedules only; fcfs is the plain baseline)."""

    schedule: str = "lpm"
    max_prefill_tokens: int = 512
    max_running: int = 64
    max_wait_steps: int = 64
    max_wait_s: float = 10.0
    in_batch_sharing: bool = True

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.max_prefill_tokens < 1 or self.max_running < 1:
            raise ValueError("max_prefill_tokens and max_running must be >= 1")


class Scheduler:
    """Waiting, prefilling and decoding requests of one engine; `step()` advances them all."""

    def __init__(self, engine: Engine, config: SchedulerConfig | None = None) -> None:
        self.engine = engine
        self.kv = engine.kv
        self.config = config or SchedulerConfig()
        self.waiting: list[Request] = []
        self.prefilling: list[Request] = []
        self.decoding: list[Request] = []
        self.finished: list[Request] = []  # left this step (done, aborted, failed): the owner drains it
        self.steps = 0
        self.preemptions = 0

    # ------------------------------------------------------------------ public API

    @property
    def running(self) -> list[Request]:
        return self.prefilling + self.decoding

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def add(self, req: Request) -> None:
        """Queue a request. Raises RequestTooLargeError, holding nothing, if it can never fit the pool."""
        need = self.kv.pages(len(req.prompt_ids))
        cap = self.kv.cache.capacity_blocks
        if need > cap:
            raise RequestTooLargeError(
                f"a prompt of {len(req.prompt_ids)} tokens needs {need} pages of {self.kv.page_size} tokens, "
                f"but the whole KV pool holds {cap} pages"
            )
        if req.retention and self.kv.enable_cache:
            self.engine.retention.mark(req.namespace, req.prompt_ids, req.retention)
        self.waiting.append(req)

    def abort(self, req: Request, reason: str = "cancelled") -> bool:
        """Stop a request now, in any state: free what it holds; it finishes with `reason` and its output so
        far. Returns False if it had already left."""
        if not self._remove(req):
            return False
        self.kv.abort(req)
        req.finish_reason = reason
        self._leave(req)
        return True

    def step(self) -> None:
        """One engine step: time out, decode every running request once, then prefill within the budget."""
        self.steps += 1
        now = time.perf_counter()
        for r in [*self.waiting, *self.prefilling, *self.decoding]:
            if r.deadline is not None and now >= r.deadline:
                self.abort(r, "timeout")
        self._decode()
        self._prefill()
        for r in self.waiting:
            r.wait_steps += 1

    def drain(self) -> list[Request]:
        out, self.finished = self.finished, []
        return out

    # ------------------------------------------------------------------ decode

    def _decode(self) -> None:
        batch = []
        for r in sorted(self.decoding, key=lambda r: (-r.priority, r.rid)):  # the important secure pages first
            if r.status is Status.RUNNING and self._grow(r):
                batch.append(r)
        batch = [r for r in batch if r.status is Status.RUNNING]
        if not batch:
            return
        try:
            logits = self.engine._decode(batch)
        except BaseException as exc:
            for r in batch:
                self._fail(r, exc)
            return
        # Greedy rows are decided by one argmax over the batch: one host transfer per step, not one per request.
        greedy = [r.sampler.params.greedy for r in batch]
        tokens = logits.argmax(dim=-1).tolist() if any(greedy) else []
        for i, r in enumerate(batch):
            self._emit(r, logits[i], tokens[i] if greedy[i] else None)

    def _grow(self, req: Request) -> bool:
        """Make sure `req` has a page for its next token, preempting lower-priority requests if needed."""
        while True:
            try:
                self.kv.reserve(req, req.num_kv + 1)
                return True
            except CacheFullError as exc:
                victim = min(self.running, key=lambda r: (r.priority, -r.rid))
                if victim is req:
                    if len(self.running) == 1:
                        self._fail(req, CacheFullError(f"request {req.rid} alone outgrew the KV pool: {exc}"))
                    else:
                        self._preempt(req)
                    return False
                self._preempt(victim)

    def _preempt(self, req: Request) -> None:
        self._remove(req)
        self.kv.preempt(req)
        req.wait_steps = 0
        self.preemptions += 1
        self.waiting.append(req)

    # ------------------------------------------------------------------ prefill and admission

    def _prefill(self) -> None:
        budget = self.config.max_prefill_tokens
        for r in list(self.prefilling):
            if budget <= 0:
                return
            budget -= self._prefill_chunk(r, budget)
        if budget <= 0 or not self.waiting:
            return
        now = time.perf_counter()
        cached, order = self._order(now)
        for r in order:
            if budget <= 0 or len(self.prefilling) + len(self.decoding) >= self.config.max_running:
                break
            if self._must_wait_for_sharer(r, cached.get(r.rid, 0), now):
                continue
            try:
                admitted = self.kv.admit(r, reserve=len(self.decoding), strict=False)
            except BaseException as exc:
                self.waiting.remove(r)
                self._fail(r, exc)
                continue
            if not admitted:
                if not self.prefilling and not self.decoding:  # nothing will ever free memory for it
                    self.waiting.remove(r)
                    self._fail(r, CacheFullError(f"request {r.rid} does not fit the KV pool beside pinned blocks"))
                    continue
                break
            self.waiting.remove(r)
            if r.t_admitted is None:
                r.t_admitted = now
            self.prefilling.append(r)
            budget -= self._prefill_chunk(r, budget)

    def _prefill_chunk(self, req: Request, budget: int) -> int:
        """Compute up to `budget` more prompt positions of `req`; finish its prefill if that was the last."""
        end = req.prefill_end
        n = min(end - req.num_kv, budget)
        logits = None
        if n > 0:
            try:
                logits = self.engine._prefill_chunk(req, n)
            except BaseException as exc:
                self._remove(req)
                self._fail(req, exc)
                return n
        if req.num_kv < end:
            return n
        self.prefilling.remove(req)
        self.decoding.append(req)
        if req.pin or self._anyone_waiting(req):
            self.kv.commit_prefix(req)  # in-batch sharing: the others hit this prompt from now on
            if req.pin:
                self.engine._pin(req)
        if not req.output_ids:  # fresh: its first token; a resumed request already has its next input token
            assert logits is not None
            self._emit(req, logits)
        return n

    def _emit(self, req: Request, logits: object, token: int | None = None) -> None:
        self.engine._emit(req, logits, token)  # type: ignore[arg-type]
        if req.finished:
            self._remove(req)
            self.kv.release(req)
            self._leave(req)
        else:
            self._notify(req)

    def _anyone_waiting(self, req: Request) -> bool:
        """Whether committing the prompt early can serve a waiting request (cache-aware schedules only)."""
        cfg = self.config
        if not cfg.in_batch_sharing or cfg.schedule == "fcfs":
            return False
        return any(w.namespace == req.namespace for w in self.waiting)

    # ------------------------------------------------------------------ order

    def _order(self, now: float) -> tuple[dict[int, int], list[Request]]:
        """Waiting requests in admission order, and the cached prefix length found for each (when probed)."""
        cfg = self.config
        starved = [r for r in self.waiting if r.wait_steps >= cfg.max_wait_steps or now - r.t_arrival >= cfg.max_wait_s]
        rest = [r for r in self.waiting if r not in starved]
        starved.sort(key=lambda r: r.rid)
        cached: dict[int, int] = {}
        if cfg.schedule == "fcfs" or (len(rest) <= 1 and not self.prefilling):
            rest.sort(key=lambda r: (-r.priority, r.rid))
            return cached, starved + rest
        nodes: dict[int, TreeNode | None] = {}
        for r in rest:
            cached[r.rid], nodes[r.rid] = self.kv.peek(r.all_ids[: r.prefill_end - 1], r.namespace)
        if cfg.schedule == "lpm":
            rest.sort(key=lambda r: (-r.priority, -cached[r.rid], r.rid))
        else:
            rest = self._dfs_weight(rest, nodes)
        return cached, starved + rest

    @staticmethod
    def _dfs_weight(reqs: list[Request], nodes: dict[int, TreeNode | None]) -> list[Request]:
        """Depth-first over the cached subtrees the requests hit, heaviest (most requests) child first; within a
        subtree, requests that hit deeper go before those whose hit ends higher up (they need fewer new pages)."""
        weight: dict[int, int] = defaultdict(int)
        children: dict[int, dict[int, TreeNode]] = defaultdict(dict)
        at: dict[int, list[Request]] = defaultdict(list)
        tops: dict[int, TreeNode] = {}
        loose = []
        for r in reqs:
            node = nodes[r.rid]
            if node is None:
                loose.append(r)
                continue
            at[node.uid].append(r)
            while node is not None:
                weight[node.uid] += 1
                parent = node.parent
                if parent is None:
                    tops[node.uid] = node
                else:
                    children[parent.uid][node.uid] = node
                node = parent
        out: list[Request] = []

        def visit(node: TreeNode) -> None:  # the subtree's deeper hits before the requests that end here
            kids = sorted(children[node.uid].values(), key=lambda n: (-weight[n.uid], n.uid))
            for kid in kids:
                visit(kid)
            out.extend(sorted(at[node.uid], key=lambda r: r.rid))

        for top in sorted(tops.values(), key=lambda n: (-weight[n.uid], n.uid)):
            visit(top)
        out.extend(sorted(loose, key=lambda r: r.rid))
        out.sort(key=lambda r: -r.priority)  # stable: priority first, the DFS order within a priority
        return out

    def _must_wait_for_sharer(self, req: Request, cached: int, now: float) -> bool:
        """In-batch sharing: wait while a request being prefilled computes a page this one would compute too."""
        cfg = self.config
        if not cfg.in_batch_sharing or cfg.schedule == "fcfs" or not self.kv.enable_cache:
            return False
        if req.wait_steps >= cfg.max_wait_steps or now - req.t_arrival >= cfg.max_wait_s:
            return False
        p = self.kv.page_size
        mine = as_token_array(req.all_ids[: req.prefill_end - 1])
        for other in self.prefilling:
            if other.namespace != req.namespace:
                continue
            theirs = as_token_array(other.all_ids[: other.prefill_end])
            shared = common_prefix_length(theirs, mine, 0)
            if shared - shared % p > max(cached, other.tree_blocks * p):
                return True
        return False

    # ------------------------------------------------------------------ leaving

    def _remove(self, req: Request) -> bool:
        for queue in (self.waiting, self.prefilling, self.decoding):
            if req in queue:
                queue.remove(req)
                return True
        return False

    def _fail(self, req: Request, exc: BaseException) -> None:
        self._remove(req)
        self.kv.abort(req)
        req.error = exc
        self._leave(req)

    def _leave(self, req: Request) -> None:
        req.t_finish = time.perf_counter()
        self.finished.append(req)
        self._notify(req)

    @staticmethod
    def _notify(req: Request) -> None:
        """Tell a streaming caller about new tokens; a caller that went away (closed event loop) is ignored."""
        if req.listener is not None:
            try:
                req.listener(req)
            except Exception:
                req.listener = None
