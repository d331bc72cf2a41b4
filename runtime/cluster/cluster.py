"""The front door of N engine replicas on Ray: route each request by radixcache.router, keep the router's index by
the replicas' cache events, and survive replicas that die.

- Replicas are Ray actors (runtime.cluster.replica), each with its own CPU share and torch thread count, restarted
  by Ray when they die (`max_restarts=-1`).
- A poller thread pulls each replica's event batches every `poll_interval` seconds (`events_since(last seq)`); a gap
  (batches no longer kept) or a new incarnation (a restarted replica) resyncs that replica from a snapshot.
- A replica whose call fails with a Ray actor error leaves the routing set at once (its index and load are dropped);
  the poller adds it back, with an empty index, once Ray has restarted it. A request that failed on a dead replica
  is re-sent to another (no token was sent: results are whole), at most once (runtime.cluster.resend): a request that
  kills its replica (a native crash, an OOM kill) would otherwise kill each one in turn. It fails with
  ReplicaUnavailableError past that, when no replica is left, or when its replica does not answer within
  `call_timeout`, or within its own `timeout` and a grace (runtime.cluster.stream_wait) (HTTP 503 each). No
  request waits on a dead actor: Ray fails its pending calls.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from radixcache.page_hash import PageHasher, namespace_key
from radixcache.router import LoadTracker, RouteRequest, RouterIndex, make_router
from radixcache.runtime.cluster.fanout import ask_each, read_wait
from radixcache.runtime.cluster.membership import Membership
from radixcache.runtime.cluster.placement import (
    CONTROL_GROUP,
    CONTROL_THREADS,
    actor_threads,
    call_bound,
    check_cache_on,
    check_cpu_share,
    check_cpus,
    check_poll_interval,
    check_reachable,
    check_replica_threads,
    node_cpus,
    seconds_option,
    wait_started,
)
from radixcache.runtime.cluster.replica import EngineReplica
from radixcache.runtime.cluster.resend import LIVE_CHECK_S, STALL_TIMEOUT_S, after_death
from radixcache.runtime.cluster.stream_wait import answered, end_by
from radixcache.runtime.engine.errors import ReplicaUnavailableError

if TYPE_CHECKING:  # the options module imports torch; this one is imported before any model loads
    from radixcache.runtime.engine.options import RequestOptions

log = logging.getLogger("radixcache.cluster")


# The most a poll round waits for the answers it asked for: one not in by then is applied in a later round, which does
# not wait for it (a frozen or restarting replica held every round 5 s, and the others' events with it).
POLL_WAIT_S = 0.1
# The most a finished request waits for its replica's events (`done`) before its caller gets the result it holds: the
# sync only spares the next turn a poll interval, and a replica that froze after its last item answers no pull.
SYNC_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class ClusterStats:
    """The routing set and the index now. `deaths`: replicas seen dying; `retries`: requests re-sent after a death."""

    replicas: int
    alive: tuple[int, ...]
    index_pages: dict[int, int]
    resyncs: int
    gaps: int
    deaths: int
    retries: int
    routed: dict[int, int]


class ReplicaCluster(Membership):
    """`replicas` engine replicas of `model` behind the router `router` (radixcache.router.ROUTERS).

    `engine_kwargs` go to every replica's Engine; `threads` is each replica's torch thread count and `cpus` its
    Ray CPU share. Starts a local Ray cluster (`num_cpus`), or connects to `address`, unless Ray is initialised
    already; a start that fails shuts down the Ray it started (`owns_ray`), and `close` leaves Ray running.
    A cluster with fewer CPUs than `replicas * cpus` is a ValueError before any replica starts (Ray would never
    place the ones that do not fit). `call_timeout`: the most seconds a replica's answer is awaited (None or
    infinity: no bound); `poll_interval`: seconds between event pulls (None: the caller polls). Before a re-send
    after a replica died, the others are asked whether they live (`Membership.check_live`), waiting at most
    `live_check_s` (and `call_timeout`) for all: one whose engine loop has had work and made no progress for
    `stall_timeout` seconds (a step that never returns; None: never checked) counts as dead, as one whose loop died."""

    def __init__(
        self,
        model: str,
        replicas: int,
        *,
        router: str = "cache_aware",
        engine_kwargs: dict[str, Any] | None = None,
        threads: int = 1,
        cpus: float = 1.0,
        address: str | None = None,
        num_cpus: int | None = None,
        poll_interval: float | None = 0.05,
        call_timeout: float | None = 600.0,
        live_check_s: float = LIVE_CHECK_S,
        stall_timeout: float | None = STALL_TIMEOUT_S,
    ) -> None:
        import ray

        if type(replicas) is not int or replicas < 1:  # 2.0 started Ray, then failed in range(); True made one
            raise ValueError(f"replicas must be an int >= 1, got {replicas!r}")
        self.router = make_router(router)  # an unknown name is refused before any replica loads its model
        check_cpu_share(cpus)  # before a local Ray cluster starts (seconds, and left running by the error)
        check_replica_threads(threads)
        check_cache_on(engine_kwargs)
        concurrency = actor_threads(engine_kwargs)  # as the share: a count no actor can start is refused first
        call_timeout = call_bound(call_timeout)
        self.live_check_s = seconds_option("live_check_s", live_check_s, none_ok=False)
        self.stall_timeout = seconds_option("stall_timeout", stall_timeout, none_ok=True)
        check_poll_interval(poll_interval)
        # Ray this start began (a local cluster, or a connection to `address`) is ended if the start fails: left
        # running, the retry with the num_cpus its error advises joined it and ignored num_cpus.
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            check_reachable(address)
            ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        self.ray = ray
        self.actor_errors = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
        try:
            check_cpus(replicas, cpus, node_cpus(ray))
            infos = self._start(model, replicas, engine_kwargs, threads, cpus, concurrency)
        except BaseException:
            if self.owns_ray:
                ray.shutdown()
            raise
        self.info = infos[0]
        self.fingerprint, self.page_size = infos[0]["fingerprint"], infos[0]["page_size"]
        self.model_name = infos[0]["model"]
        self.max_position: int = infos[0]["max_position"]
        self.index = RouterIndex()
        self.loads = LoadTracker()
        self._incarnation = {r: info["incarnation"] for r, info in enumerate(infos)}
        self._alive = set(self._actors)
        self._broken: dict[int, str | None] = {}  # replica -> the incarnation whose engine loop died (never rejoins)
        for r in self._actors:
            self.index.add_replica(r)
        self._lock = threading.Lock()  # guards index, loads, router and the routing set
        self._sync_locks = {r: threading.Lock() for r in self._actors}  # one event reader per replica
        self._poll_lock = threading.Lock()
        self._pulls: dict[int, tuple[tuple[bool, Any], float]] = {}  # the poller's unanswered pulls (Membership.poll)
        self._rids = itertools.count()
        self._name = uuid.uuid4().hex[:12]  # names unique across front doors: replicas remember cancels by name
        self.hasher = PageHasher(self.fingerprint, self.page_size)
        self.call_timeout = call_timeout
        # The replicas' queue timeout, which the front door also holds (runtime.cluster.front): a request that has not
        # been admitted by then fails there, however late the replica's own verdict would come back over Ray.
        self.queue_timeout: float | None = (engine_kwargs or {}).get("queue_timeout")
        self._deaths = self._retries = 0
        self._seen_dead: dict[int, int] = {}  # replica -> when the front door last saw it die (Membership.death_mark)
        self._routed = dict.fromkeys(self._actors, 0)
        self._stop = threading.Event()
        self.poll_interval = poll_interval
        self._poller: threading.Thread | None = None
        if poll_interval is not None:  # None: the caller polls (tests that need to control when events arrive)
            self._poller = threading.Thread(target=self._poll_forever, name="radixcache-events", daemon=True)
            self._poller.start()

    def _start(
        self, model: str, replicas: int, engine_kwargs: dict[str, Any] | None, threads: int, cpus: float, each: int
    ) -> list[Any]:
        """Start the replica actors (`each`: each one's max_concurrency) and return their `info`, once all have
        answered. A replica whose engine could not be built raises its own error, one whose process died a
        RuntimeError (runtime.cluster.placement.wait_started), every actor ended first."""
        ray = self.ray
        actor = ray.remote(concurrency_groups={CONTROL_GROUP: CONTROL_THREADS})(EngineReplica).options(
            num_cpus=cpus, max_restarts=-1, max_task_retries=0, max_concurrency=each
        )
        self._actors = {r: actor.remote(r, model, engine_kwargs, threads) for r in range(replicas)}
        try:
            return wait_started(ray, self._actors, [a.info.remote() for a in self._actors.values()])
        except BaseException as exc:  # a replica's engine could not be built (its own error), or its process died
            for a in self._actors.values():
                ray.kill(a, no_restart=True)
            cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else None
            if isinstance(cause, Exception):
                raise cause from None
            raise

    # ------------------------------------------------------------------ requests

    def page_keys(self, prompt_ids: Sequence[int], namespace: Hashable = None) -> list[bytes]:
        """The prompt's page keys, hashed as every replica hashes its pages (same fingerprint and namespace)."""
        return self.hasher.hashes(prompt_ids, namespace)

    def route_request(
        self, prompt_ids: Sequence[int], max_new_tokens: int, namespace: Hashable = None, session: str | None = None
    ) -> RouteRequest:
        """What the router sees of a request: its page keys, sizes and session. Its decode is what the replica can
        generate: at most up to the model's max_position, where the engine ends it ("length"), however large
        `max_new_tokens` (one of 10**9, "until EOS", counted as 10**9 tokens of work, kept every later request off
        its replica through cache_aware's recent work; 10**400 was an OverflowError). Its session is scoped to its
        `namespace` (a tenant's): two tenants' "chat-1" are two sessions (the Python API's shared one's stickiness).
        The scope is the namespace's name in the page keys (radixcache.page_hash.namespace_key), so the namespaces the
        tree takes for one (1 and 1.0, a StrEnum member and its string, a frozenset in any order) are one session's
        scope too: scoped by `repr`, one conversation sent under both lost its stickiness to the replica holding it."""
        keys = self.page_keys(prompt_ids, namespace)
        decode = max(0, min(max_new_tokens, self.max_position - len(prompt_ids)))
        scoped = None if session is None else f"{namespace_key(namespace)}|{session}"  # a str quoted: no collisions
        return RouteRequest(keys, len(prompt_ids), decode, self.page_size, scoped)

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int | None = None,
        *,
        options: RequestOptions | None = None,
        **kwargs: Any,
    ) -> Any:
        """Route one request (token ids) and return its GenerationResult. Takes Engine.generate's options:
        `options` with keywords over it (`session` too: it chooses the replica, whose engine never sees it). A replica
        that dies under it is dropped and the request re-sent to another (at most once: runtime.cluster.resend);
        ReplicaUnavailableError when none is left."""
        from radixcache.runtime.engine.options import resolve_options

        # resolved here, once: the route hashes the prompt in the namespace its replica caches it under
        opts = resolve_options(max_new_tokens, options, kwargs, "ReplicaCluster.generate")
        prompt_ids = _prompt_ids(prompt_ids)
        request = self.route_request(prompt_ids, opts.max_new_tokens, opts.namespace, opts.session)
        call = {"options": opts.updated(session=None)}
        took = (
            time.monotonic()
        )  # its timeout counts from here, on a re-send too (the replica is told the seconds spent)
        end_at = end_by(took, opts.timeout)  # its replica ends it at its timeout; a frozen one does not
        answer_by = None if opts.timeout is None else took + opts.timeout  # its sync waits not past its timeout
        tried: set[int] = set()  # the replicas that failed it: never offered it again
        died: set[int] = set()  # those whose death the front door first saw after it was sent there (resend)
        while True:
            replica, rid = self.dispatch(request, tried)
            computed = True
            name = f"{self._name}-g{rid}"  # the replica's name for it: a cancel sent there finds it
            mark = self.death_mark()  # before it is sent: a death seen later may be its doing
            try:
                spent = time.monotonic() - took
                ref = self._actors[replica].generate.remote(list(prompt_ids), opts.max_new_tokens, call, name, spent)
                if not answered(self, ref, replica, name, end_by=end_at):  # call_timeout passed
                    raise self.ray.exceptions.GetTimeoutError(name)
                return self.ray.get(ref)
            except ReplicaUnavailableError:  # not ended past its timeout: cancelled there (stream_wait), a 503
                computed = False
                raise
            except (*self.actor_errors, self.ray.exceptions.RayTaskError) as exc:
                if not self.actor_died(replica, exc):  # the engine refused or failed it: its own exception, as
                    cause = getattr(exc, "cause", None)  # ClusterEngine's (Ray's wrapper's text is a traceback)
                    raise cause if isinstance(cause, Exception) else exc from None
                after_death(self, tried, died, replica, mark, exc)
                self.count_retry()
            except self.ray.exceptions.GetTimeoutError:  # alive but not answering: the client may retry (503)
                computed = False
                self.control(replica, "cancel").remote(name)  # it would run on there, its load released here
                raise ReplicaUnavailableError(
                    f"engine replica {replica} did not answer within {self.call_timeout} s; the request was cancelled"
                ) from None
            except BaseException:  # the caller's wait was interrupted (Ctrl-C): it stops on the replica too
                self.control(replica, "cancel").remote(name)
                raise
            finally:
                self.done(replica, rid, computed=computed, by=answer_by)  # no sync with a replica that does not answer

    def dispatch(self, request: RouteRequest, tried: set[int]) -> tuple[int, int]:
        """Choose a live replica not in `tried` and count the request's load on it: (replica, load id)."""
        with self._lock:
            candidates = sorted(self._alive - tried)
            if not candidates:
                raise ReplicaUnavailableError("no live engine replica can take the request")
            rid = next(self._rids)
            request = replace(request, rid=rid)  # routers that remember it in flight drop it when `done(rid)`
            # the route's match, not the index's: cache_aware and sglang count prefixes in flight there as cached
            replica, matched = self.router.route(request, candidates, self.index, self.loads)
            self.loads.dispatched(replica, rid, request.uncached_tokens(matched), request.max_tokens)
            self._routed[replica] += 1
        return replica, rid

    def done(self, replica: int, rid: int, computed: bool = True, by: float | None = None) -> None:
        """The request `rid` left `replica` (finished, failed or cancelled). The replica's events are pulled first,
        so the pages it just computed are in the index before its in-flight record goes: the conversation's next
        turn, sent the moment this one returns, finds them (the poller alone would leave a gap of up to one
        interval). A request that `computed` nothing (refused, timed out in the queue) skips that round trip: under
        a starved CPU, 69 queue timeouts each waiting for a sync behind the others' took 6 to 10 s to fail. So does
        one whose replica stopped answering (`computed=False`): a sync would wait call_timeout again, behind the
        poller's and the other requests' (a frozen replica's k-th request failed after (k + 1) call_timeouts).
        The sync waits at most SYNC_WAIT_S (or call_timeout if shorter), and not past `by` (time.monotonic(): the
        request's timeout): a replica that froze after sending a result held that result from its caller for
        call_timeout (600 s), past the request's timeout; the poller catches the index up once it answers."""
        if computed and replica in self._alive:
            wait = SYNC_WAIT_S if by is None else max(0.0, min(SYNC_WAIT_S, by - time.monotonic()))
            self.sync(replica, wait)
        with self._lock:
            self.loads.finished(replica, rid)

    def prefill_done(self, replica: int, rid: int) -> None:
        """The request `rid` has its first token: its prefill leaves `replica`'s load (its decode stays)."""
        with self._lock:
            self.loads.prefill_done(replica, rid)

    def count_retry(self) -> None:
        with self._lock:
            self._retries += 1

    # ------------------------------------------------------------------ membership and events

    def _poll_forever(self) -> None:
        assert self.poll_interval is not None
        while not self._stop.wait(self.poll_interval):
            try:
                self.poll(POLL_WAIT_S)
            except Exception:  # one bad round must not end the polling for good (the thread would die silently)
                log.exception("polling the replicas' cache events failed; polling on")

    # ------------------------------------------------------------------ inspection and shutdown

    @property
    def alive(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self._alive))

    def actor(self, replica: int) -> Any:
        return self._actors[replica]

    def control(self, replica: int, method: str) -> Any:
        """`replica`'s actor method `method`, called in the control group: it never queues behind requests."""
        return getattr(self._actors[replica], method).options(concurrency_group=CONTROL_GROUP)

    def replica_stats(self) -> list[Any]:
        """Every live replica's EngineStats (a replica that fails the call is dropped; runtime.cluster.fanout.read_wait
        bounds the wait)."""
        return list(self.each("stats", wait=read_wait(self)).values())

    def replica_call(self, method: str, *args: Any) -> list[Any]:
        """`method(*args)` on every live replica (EngineReplica), in replica order; a replica that fails it is
        dropped, and one that does not answer within `call_timeout` is a ReplicaUnavailableError."""
        return list(self.each(method, *args).values())

    def each(self, method: str, *args: Any, wait: float | None = None) -> dict[int, Any]:
        """`replica_call`, each answer under the replica that gave it, all asked at once and answered within `wait`
        seconds (None: call_timeout; runtime.cluster.fanout.ask_each)."""
        return ask_each(self, method, *args, wait=wait)

    def stats(self) -> ClusterStats:
        with self._lock:
            s = self.index.stats
            return ClusterStats(
                replicas=len(self._actors),
                alive=tuple(sorted(self._alive)),
                index_pages={r: self.index.pages(r) for r in sorted(self._alive)},
                resyncs=s.resyncs,
                gaps=s.gaps,
                deaths=self._deaths,
                retries=self._retries,
                routed=dict(self._routed),
            )

    def close(self) -> None:
        """Stop polling and end the replicas. The Ray cluster is left running, one this front door started too:
        another front door of the process may have joined it since (`ray.shutdown()` ends it)."""
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=10)
        for actor in self._actors.values():
            self.ray.kill(actor, no_restart=True)

    def __enter__(self) -> ReplicaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _prompt_ids(prompt: Any) -> list[int]:
    """`prompt` as token ids, checked at the call as Engine.generate checks them (the request builder's `token_ids`):
    `list()` took bytes and a dict's keys for token ids (a dict ran), text became a list of characters that its
    replica's engine read as a batch of prompts (an AttributeError there), and None failed in `len()`."""
    from radixcache.runtime.engine.request_builder import token_ids  # it imports torch; this module does not

    if isinstance(prompt, str):
        raise ValueError(
            "ReplicaCluster.generate takes token ids, not text: encode it first, or send it through ClusterEngine "
            "(runtime.cluster.front), which holds the tokenizer"
        )
    ids = token_ids(prompt, "prompt")
    if not ids:
        raise ValueError("the prompt is empty")
    return ids
