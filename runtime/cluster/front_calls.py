"""The front door's calls to every replica at once (runtime.cluster.front.ClusterEngine, a ReplicaCalls): the
replicas' stats summed for /metrics, `check`, `flush`, `unpin` of pins on every replica, each replica's share of a
replay and the replay's warm-up sent to every replica directly; each bounded (a frozen replica holds none of them for
ever). The state is the front door's (its `__init__` sets it)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from radixcache.runtime.cluster.calls import render_messages
from radixcache.runtime.cluster.cluster import ReplicaCluster
from radixcache.runtime.cluster.fanout import engine_error, gather, read_wait, silent_error
from radixcache.runtime.cluster.tally import Baseline, Counters, replica_rows
from radixcache.runtime.engine.errors import ReplicaUnavailableError
from radixcache.runtime.engine.options import RequestOptions, resolve_options
from radixcache.runtime.engine.request_builder import is_messages
from radixcache.runtime.kv.tier.disk_writer import wait_bound
from radixcache.runtime.tools import ToolCallMemory


class ReplicaCalls:
    """ClusterEngine's calls to every replica; the state is the front door's (its `__init__` sets it)."""

    cluster: ReplicaCluster
    tokenizer: Any
    tool_memory: ToolCallMemory
    _rid_prefix: str
    _baseline: Baseline
    _counters: Counters
    _replica_up: dict[int, bool]  # each replica: whether it answered the last stats read

    _prompt_ids: Callable[[Any, RequestOptions], list[int]]  # ClusterEngine's

    def unpin(self, prompt: Sequence[int] | str | Sequence[dict[str, Any]] | None = None, **kwargs: Any) -> int:
        """Release pins (`pin=` on a request) on every replica: those of `prompt` (in `namespace`), every pin of a
        `namespace` given alone, or every pin, as Engine.unpin does; how many were released in all. It takes what
        Engine.unpin takes: text, ids, or chat messages with the `tools=` (or `options=`) of the pinning request,
        rendered here as the server renders a chat (with this front door's memory of the calls the model wrote, whose
        ids the history carries; a replica's own memory knows them by other ids). A pinned request ran on one
        replica, which the front door does not remember, so each is asked."""
        opts = resolve_options(
            kwargs.pop("max_new_tokens", None), kwargs.pop("options", None), kwargs, "ClusterEngine.unpin"
        )
        if is_messages(prompt):
            prompt = render_messages(self.tokenizer, self.tool_memory, prompt, opts)  # type: ignore[arg-type]
        ids = None if prompt is None else self._prompt_ids(prompt, opts)
        everywhere = "namespace" not in kwargs and opts.namespace is None  # unpin(): every namespace's, as Engine's
        released = self.cluster.replica_call("unpin", ids, opts.namespace, everywhere, opts.pin_holder)
        if not released:  # as check and flush: "none pinned" would be a guess
            raise ReplicaUnavailableError("no live replica answered the unpin (every replica is dead)")
        return sum(released)

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Each replica's queued disk writes (with --cache-dir) finish; False if one has not within `timeout`."""
        try:
            return all(self._each_within("flush", wait_bound(timeout)))  # a bad bound refused here, as Engine's
        except ReplicaUnavailableError:  # still writing (or stuck) past the bound: Engine.flush's False
            return False

    def _each_within(self, method: str, bound: float | None) -> list[Any]:
        """`method(bound)` on every live replica at once, all answered within `bound` seconds (None: call_timeout):
        one that has not is a ReplicaUnavailableError (503); one found dead leaves the routing set; none left to
        answer is a ReplicaUnavailableError too (a check of no replica said "ok", where a dead engine's is a 503)."""
        cluster = self.cluster
        wait = cluster.call_timeout if bound is None else bound
        deadline = time.monotonic() + wait
        out = []
        for replica, ref in [(r, cluster.control(r, method).remote(bound)) for r in cluster.alive]:
            try:
                out.append(cluster.ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
            except (*cluster.actor_errors, cluster.ray.exceptions.RayTaskError) as exc:
                if not cluster.actor_died(replica, exc):  # a dead engine leaves the routing set, as a dead actor
                    raise engine_error(exc) from None  # the engine's own (a broken invariant, a closed engine)
            except cluster.ray.exceptions.GetTimeoutError:
                raise ReplicaUnavailableError(
                    f"engine replica {replica} did not answer {method} within {wait} s"
                ) from None
        if not out:
            raise ReplicaUnavailableError("no live engine replica")
        return out

    def warm_up(self, prompt: Sequence[int], max_new_tokens: int, *, namespace: Any = None) -> None:
        """`prompt` on every live replica at once, sent to each directly: the router neither counts nor routes it, so
        each replica's one-off start-up costs land here, not on the first measured request routed to it (the replay's
        warm-up; a namespace of its own keeps its pages from matching any measured prompt). All are awaited
        `call_timeout` in all: past it the unanswered ones are cancelled there and it is a ReplicaUnavailableError."""
        cluster = self.cluster
        call, name = {"namespace": namespace}, f"{self._rid_prefix}-warm"
        refs = [(r, cluster.actor(r).generate.remote(list(prompt), max_new_tokens, call, name)) for r in cluster.alive]
        deadline = time.monotonic() + cluster.call_timeout
        for i, (replica, ref) in enumerate(refs):
            try:
                cluster.ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except (*cluster.actor_errors, cluster.ray.exceptions.RayTaskError) as exc:
                if not cluster.actor_died(replica, exc):  # a dead replica (or engine) leaves the routing set
                    raise engine_error(exc) from None
            except cluster.ray.exceptions.GetTimeoutError:  # Ray's own error reached the replay, its request ran on
                for r, _ in refs[i:]:  # those before it have answered
                    cluster.control(r, "cancel").remote(name)
                raise ReplicaUnavailableError(
                    f"engine replica {replica} did not answer the warm-up within {cluster.call_timeout} s"
                ) from None
        self._baseline = Baseline.take(cluster, tuple(cluster.page_keys(prompt, namespace)))

    @property
    def stats(self) -> Any:
        """The replicas' EngineStats summed (gauges too: the live replicas' pages, running and waiting); counters
        keep what replicas that died or restarted had counted (runtime.cluster.tally.Counters). A replica that does
        not answer within runtime.cluster.fanout.read_wait (frozen: alive, answering nothing) is left out, its
        counters kept at their last reading, and shown down in `replica_up`: /metrics answers with the others'
        figures (it was a 503 for as long as one replica was frozen). None answering is a ReplicaUnavailableError."""
        cluster = self.cluster
        wait = read_wait(cluster)
        answers, silent = gather(cluster, "counted_stats", wait=wait)
        self._replica_up = {r: r in answers for r in range(cluster.stats().replicas)}
        if silent and not answers:  # none to report: a 503 naming them
            raise silent_error(cluster, silent, "counted_stats", wait)
        return self._counters.total(answers)

    @property
    def replica_up(self) -> dict[int, bool]:
        """Whether each replica answered the last `stats` read (/metrics' radixcache_replica_up): one dead, or alive
        and frozen (not answering within its bound), is down; `stats` left it out of the gauges, and its counters
        stay at their last reading (counters never go back)."""
        return dict(self._replica_up)

    def per_replica(self) -> list[dict[str, Any]]:
        """Each live replica's share of the measured run (since the replay's warm-up, runtime.cluster.tally): requests
        routed to it, its prompt and cached tokens, its indexed pages."""
        return replica_rows(self.cluster, self._baseline)

    def check(self, timeout: float | None = 30.0) -> dict[str, int]:
        out: dict[str, int] = {}
        for part in self._each_within("check", wait_bound(timeout)):  # a bad bound: ValueError, as Engine.check's
            for k, v in part.items():
                out[k] = out.get(k, 0) + v
        return out
