"""The front door's Python API (ClusterEngine) refuses hostile arguments as an Engine does: a ValueError at the call,
naming what was wrong, and nothing sent to a replica. Replicas are stand-ins (tests/cluster/stand_in.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cluster.stand_in import install


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> Iterator[Any]:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    engine = ClusterEngine(ReplicaCluster("fake", 2, poll_interval=None), str(tiny_dir))
    yield engine
    engine.close()


def _streams(front: Any) -> list[str]:
    return [rid for r in (0, 1) for rid in front.cluster.actor(r).streams]


@pytest.mark.parametrize(
    "prompt", [b"abc", bytearray(b"ab"), {1: 2}, None, 5, 1.5, [1, "a"], [True, 2], [[1, 2]], np.array([1.5])]
)
def test_a_prompt_that_is_not_token_ids_is_refused_at_the_call(front: Any, prompt: Any) -> None:
    """Regression: the front door took `list(prompt)` for token ids, so bytes ran as their byte values and a dict as
    its keys, and None or a number failed later in the request's thread with a TypeError."""
    with pytest.raises(ValueError, match="prompt") as refused:
        front.submit(prompt, 2)
    assert "token id" in str(refused.value)
    assert _streams(front) == [] and front.cluster.loads.in_flight() == 0


def test_token_ids_of_any_integer_type_are_sent_as_ints(front: Any) -> None:
    result = front.submit(np.array([3, 4, 5]), 2).result(timeout=10)  # the stand-in echoes the last token
    assert result.token_ids == (5, 5) and type(result.token_ids[0]) is int


@pytest.mark.parametrize("router", ["cache_aware", "consistent_hash"])
@pytest.mark.parametrize("session", [5, ["x"], b"user"])
def test_a_session_that_is_not_a_string_is_refused_at_the_call(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path, router: str, session: Any
) -> None:
    """Regression: the session went unchecked to the router, in the request's thread: consistent_hash failed with an
    AttributeError (`.encode`), cache_aware with a TypeError for an unhashable one. An Engine ignored it."""
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    engine = ClusterEngine(ReplicaCluster("fake", 2, router=router, poll_interval=None), str(tiny_dir))
    try:
        with pytest.raises(ValueError, match="session must be a string or None"):
            engine.submit([1, 2, 3], 2, session=session)
        assert _streams(engine) == []
        assert engine.submit([1, 2, 3], 2, session="tenant|user").result(timeout=10).token_ids == (3, 3)
    finally:
        engine.close()


def test_a_request_admitted_on_a_replica_that_dies_is_resent_with_a_fresh_queue_timeout(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    """Regression: a request re-sent after its replica died before its first token kept its first send time, so
    one admitted there and computing past the queue timeout failed at once with QueueTimeoutError ("not admitted
    within the queue timeout") instead of being re-sent as documented. Its wait in a queue had ended."""
    import time

    from tests.cluster.stand_in import RayActorError, echo_script

    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None, engine_kwargs={"queue_timeout": 0.2})
    engine = ClusterEngine(cluster, str(tiny_dir))

    def admitted_then_dies(prompt: list[int], options: Any) -> list[Any]:
        # admitted, then a long prefill: past the queue timeout (and its grace) since the send, then the death
        return [("admitted", None, None), lambda: time.sleep(0.6), RayActorError("died")]

    cluster.actor(0).script = admitted_then_dies
    cluster.actor(1).script = echo_script
    try:
        handle = engine.submit([1, 2, 3], 2)
        assert handle.result(timeout=10).token_ids == (3, 3)
        assert handle.request.replica == 1 and cluster.stats().retries == 1
    finally:
        engine.close()


def test_cancelling_an_agenerate_task_cancels_its_request_on_the_replica(front: Any) -> None:
    """Regression: `asyncio.wrap_future` cancels the handle's future with the awaiting task, and the cancel that
    followed saw a done handle and sent nothing: the request ran on its replica to its length (its load counted
    there all along), where Engine.agenerate cancels it."""
    import asyncio
    import threading

    from tests.cluster.stand_in import result_for

    release = threading.Event()
    for r in (0, 1):  # a stream that sends a token, then waits (a long generation), then ends
        front.cluster.actor(r).script = lambda prompt, options: [
            ("tokens", [7], [None]),
            release.wait,
            ("done", result_for(prompt, [7], "cancelled"), None),
        ]

    async def cancel_mid_stream() -> None:
        task = asyncio.create_task(front.agenerate([1, 2, 3], 50))
        while not _streams(front):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(cancel_mid_stream())
        (rid,) = _streams(front)
        assert [c for r in (0, 1) for c in front.cluster.actor(r).cancels] == [rid]
    finally:
        release.set()


@pytest.mark.parametrize(
    ("prompts", "each", "match"),
    [
        ([[1, 2, 3], b"xy"], (), "got bytes"),  # the first prompt was sent before the second was refused
        ([[1, 2, 3], []], (), "the prompt is empty"),
        ([[1, 2, 3]], [{}, {"seed": 1}], "each has 2 entries for 1 prompts"),  # the extra entry was ignored
        ([1, 2, 3], (), "got one prompt"),  # each id taken for a prompt
        ([[1, 2, 3]] * 1025, (), "queues at most 1024 requests together"),  # a thread per request, unbounded
        (None, (), "a prompt must be text"),  # a TypeError from len()
    ],
    ids=["bad-second", "empty-second", "each-longer", "one-prompt", "too-many", "none"],
)
def test_a_group_with_a_bad_prompt_or_each_sends_nothing(front: Any, prompts: Any, each: Any, match: str) -> None:
    """Regression: ClusterEngine.submit_group sent its prompts one by one as it checked them, so a bad one left the
    ones before it running on a replica with no handle to cancel them; an `each` of the wrong length was ignored.
    Engine.submit_group refuses such a call whole (ValueError), before anything is queued."""
    with pytest.raises(ValueError, match=match):
        front.submit_group(prompts, 2, each=each)
    assert _streams(front) == [] and front.cluster.loads.in_flight() == 0


def test_an_unknown_keyword_names_the_call_it_was_given_to(front: Any) -> None:
    """generate and agenerate named ClusterEngine.submit(), the method they call, as Engine's did."""
    import asyncio
    import re

    with pytest.raises(TypeError, match=re.escape("ClusterEngine.generate() got an unexpected keyword argument 'x'")):
        front.generate([3, 4], 2, x=1)
    with pytest.raises(TypeError, match=re.escape("ClusterEngine.agenerate() got an unexpected keyword argument 'x'")):
        asyncio.run(front.agenerate([3, 4], 2, x=1))
    assert front.generate([3, 4, 5], 2).token_ids == (5, 5) and _streams(front) != []


def test_each_of_a_group_must_hold_one_dict_per_prompt(front: Any) -> None:
    with pytest.raises(ValueError, match=r"each\[1\] must be a dict"):  # a TypeError from inside `updated`
        front.submit_group([[3, 4], [5, 6]], 2, each=[{}, 7])
    assert _streams(front) == []


@pytest.mark.parametrize("timeout", [float("nan"), -1, "5", True])
def test_a_wait_bound_that_is_no_number_of_seconds_is_refused_as_by_the_engine(front: Any, timeout: Any) -> None:
    """ClusterEngine's check, wait_idle and close took any timeout (ignored), and flush handed it to every replica;
    Engine refuses NaN, a negative, a string or a bool with a ValueError naming timeout."""
    for call in (front.check, front.wait_idle, front.flush, front.close):
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0 or None"):
            call(timeout)
    assert not front._closed  # the refused close closed nothing


@pytest.mark.parametrize("max_new_tokens", [10**9, 10**400])
def test_a_request_asking_past_the_context_counts_only_what_its_replica_can_generate(
    front: Any, tiny_dir: Path, max_new_tokens: int
) -> None:
    """Regression: the router counted max_new_tokens as the request's decode, where the engine ends it at the model's
    max_position: one request of 10**9 ("until EOS") put 6.2 million seconds of recent work on its replica, and
    cache_aware then sent all of the next 200 requests to the other; 10**400 was an OverflowError, where an Engine
    generates up to max_position. It now routes as a request asking for exactly what the model can generate."""
    import random

    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine
    from tests.cluster.stand_in import result_for

    def routed_after(engine: Any, first: int) -> dict[int, int]:
        for r in (0, 1):  # a replica that answers at once (the stand-in would echo max_new_tokens tokens)
            engine.cluster.actor(r).script = lambda prompt, options: [("done", result_for(prompt, [1]), None)]
        assert engine.submit([9] * 40, first).result(timeout=10).token_ids == (1,)
        rng = random.Random(0)
        for _ in range(200):
            engine.submit([rng.randrange(250) for _ in range(40)], 16).result(timeout=10)
        return engine.cluster.stats().routed

    most = front.config.max_position - 40
    assert front.cluster.route_request([9] * 40, max_new_tokens).max_tokens == most
    reference = ClusterEngine(ReplicaCluster("fake", 2, poll_interval=None), str(tiny_dir))
    try:
        assert routed_after(front, max_new_tokens) == routed_after(reference, most)
    finally:
        reference.close()


@pytest.mark.parametrize(
    ("prompt", "kwargs", "match"),
    [
        ([1, 2, 300], {}, r"token id 300 is outside the vocabulary \[0, 260\)"),
        ([1, -1], {}, r"token id -1 is outside the vocabulary"),
        ([5] * 4096, {}, "prompt of 4096 tokens leaves no room under the model's max_position 4096"),
        ([1, 2, 3], {"logit_bias": {300: 1.0}}, r"logit_bias token id 300 is outside the vocabulary \[0, 260\)"),
        ([1, 2, 3], {"stop_token_ids": [5, 300]}, r"stop_token_ids id 300 is outside the vocabulary \[0, 260\)"),
    ],
    ids=["past-vocab", "negative", "max-position", "logit-bias", "stop-token-id"],
)
def test_what_the_model_cannot_take_is_refused_at_the_call(front: Any, prompt: Any, kwargs: Any, match: str) -> None:
    """Regression: the front door sent these to a replica, whose engine refused them in the request's thread: a
    handle came back and failed later, and submit_group had sent the group's good prompts before the bad one was
    refused (it promises all or none, as Engine.submit_group, which refuses them at the call)."""
    with pytest.raises(ValueError, match=match):
        front.submit(prompt, 2, **kwargs)
    with pytest.raises(ValueError, match=match):
        front.submit_group([[1, 2, 3], prompt], 2, **kwargs)
    assert _streams(front) == [] and front.cluster.loads.in_flight() == 0


def test_python_api_sessions_are_scoped_to_their_namespace(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> None:
    """Regression: the front door keyed the router by the bare `session=`, so two tenants (namespaces) using the same
    session id shared one session's stickiness (the server scoped its own sessions; the Python API's were not)."""
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster("fake", 2, router="cache_aware", poll_interval=None)
    front = ClusterEngine(cluster, str(tiny_dir))
    try:
        for tenant in ("acme", "globex", "acme"):
            front.generate([5, 6, 7, 8], 2, namespace=tenant, session="chat-1")
        assert len(cluster.router._sessions) == 2  # one session per tenant, each remembered on its own
        assert cluster.route_request([1], 1, None, "s").session != cluster.route_request([1], 1, "None", "s").session
    finally:
        front.close()


def test_namespaces_the_tree_takes_for_one_scope_one_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the session's scope was the namespace's `repr`, so namespaces the tree (and the router's page keys)
    take for one namespace were two sessions: a conversation sent as namespace=1 and then 1.0, or as a StrEnum member
    and then its string, lost its stickiness to the replica holding it. The scope is the namespace's page-key name."""
    import enum

    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    class Tenant(enum.StrEnum):
        ACME = "acme"

    cluster = ReplicaCluster("fake", 2, router="cache_aware", poll_interval=None)
    try:
        for same in ((1, 1.0, True), (Tenant.ACME, "acme"), (frozenset({"b", "a", 3}), frozenset({3, "a", "b"}))):
            routes = [cluster.route_request([5, 6, 7, 8], 1, ns, "chat-1") for ns in same]
            assert len({r.session for r in routes}) == 1 and len({tuple(r.page_keys) for r in routes}) == 1, same
        assert cluster.route_request([1], 1, None, "s").session != cluster.route_request([1], 1, "None", "s").session
        assert cluster.route_request([1], 1, 1, "s").session != cluster.route_request([1], 1, "1", "s").session
    finally:
        cluster.close()


class _Tenant:
    """A hashable namespace with no name that is the same in every process (radixcache.page_hash.namespace_key)."""

    def __hash__(self) -> int:
        return 1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Tenant)


def test_a_namespace_page_keys_cannot_name_is_refused_at_the_call(front: Any) -> None:
    """Regression: the front door hashed the prompt's pages in the request's thread, outside the code that ends its
    handle: namespace_key's ValueError killed the thread, and the handle never completed (its caller waited for
    ever, /health/cache counted it queued, and wait_idle never came true)."""
    with pytest.raises(ValueError, match="namespace of type _Tenant"):
        front.submit([3, 4, 5], 2, namespace=_Tenant())
    assert _streams(front) == [] and front.queue.waiting == 0 and front.wait_idle(0)


def test_a_failure_before_the_dispatch_ends_the_handle(front: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> Any:
        raise RuntimeError("the router broke")

    monkeypatch.setattr(front.cluster, "route_request", broken)
    handle = front.submit([3, 4, 5], 2)
    with pytest.raises(RuntimeError, match="the router broke"):
        handle.result(timeout=10)
    assert front.wait_idle(10) and front.queue.waiting == 0 and front.cluster.loads.in_flight() == 0


def test_a_text_past_the_context_in_bytes_is_refused_untokenised(front: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the front door tokenised any text (4 MB: 3 s of the GIL) before the context refused it; an
    Engine's request builder refuses it untokenised, as a ContextLengthError naming its bytes (the same check)."""
    from radixcache.runtime.engine.errors import ContextLengthError

    seen: list[int] = []
    real = front.tokenizer.encode
    monkeypatch.setattr(front.tokenizer, "encode", lambda text, *a, **k: seen.append(len(text)) or real(text, *a, **k))
    text = "ls -la\x00\x01 \n" * 6_000  # 60,000 bytes: past 4,095 tokens of at most 12 bytes each
    assert len(real(text)) >= front.config.max_position  # the tokenizer's own count: it could not fit
    seen.clear()
    with pytest.raises(ContextLengthError, match=r"prompt of 60,000 bytes of text .* max_position 4096") as refused:
        front.submit(text, 2)
    assert refused.value.unit == "bytes" and seen == []
    assert _streams(front) == [] and front.cluster.loads.in_flight() == 0
