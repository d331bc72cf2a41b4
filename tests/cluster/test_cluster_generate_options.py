"""ReplicaCluster.generate (the Python API's blocking call) given `options=`: it passed `namespace=None` beside them,
which overrode the options' namespace (the replica cached the prompt under None, and the router hashed it with
None), and its default `max_new_tokens=64` overrode the options' length. The options are resolved at the front door
as every entry point resolves them (keywords over `options`). What is no prompt of token ids is refused at the call,
as Engine.generate refuses it. The real replica class, in-process (tests/cluster/inproc_front.py)."""

from __future__ import annotations

from typing import Any

import pytest

from radixcache.runtime.engine.options import RequestOptions
from tests.cluster.inproc_front import inproc_front

PROMPT = list(range(1, 18))  # four whole pages of 4
ENGINE = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64"}


def test_generate_with_options_runs_and_routes_under_their_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    with inproc_front(monkeypatch, 1, "cache_aware", ENGINE) as front:
        cluster, replica = front.cluster, front.replicas[0]
        routed: list[Any] = []
        dispatch = cluster.dispatch
        monkeypatch.setattr(
            cluster, "dispatch", lambda request, tried: routed.append(request) or dispatch(request, tried)
        )
        options = RequestOptions.of(3, namespace="t", ignore_eos=True)
        result = cluster.generate(PROMPT, options=options)
        assert len(result.token_ids) == 3  # the options' length, not the default 64
        assert replica.kv.peek(PROMPT, "t")[0] == 16  # its pages are the tenant's
        assert replica.kv.peek(PROMPT, None)[0] == 0
        assert routed[0].page_keys == cluster.hasher.hashes(PROMPT, "t")
        # a keyword beside the options overrides their field, as in Engine.generate
        cluster.generate(PROMPT, 2, options=options, namespace="u")
        assert replica.kv.peek(PROMPT, "u")[0] == 16
        assert routed[1].page_keys == cluster.hasher.hashes(PROMPT, "u")


@pytest.mark.parametrize(
    ("prompt", "match"),
    [
        ({1: 2}, "got dict"),  # ran, its keys taken for token ids
        (b"abc", "got bytes"),  # its bytes taken for token ids
        ("abc", "takes token ids, not text"),  # an AttributeError inside the replica's engine
        (None, "got NoneType"),  # a TypeError from len()
        (5, "got int"),
        ([1, "a"], r"prompt\[1\] must be a token id"),
        ([], "the prompt is empty"),
    ],
    ids=["dict", "bytes", "text", "none", "int", "str-id", "empty"],
)
def test_generate_refuses_what_is_no_prompt_at_the_call(
    monkeypatch: pytest.MonkeyPatch, prompt: Any, match: str
) -> None:
    """Regression: ReplicaCluster.generate sent `list(prompt)` to a replica unchecked: a dict ran, bytes were token
    ids, text failed inside the replica's engine with an AttributeError. Now a ValueError at the call, as
    Engine.generate's, and nothing is routed."""
    with inproc_front(monkeypatch, 1, "cache_aware", ENGINE) as front:
        with pytest.raises(ValueError, match=match):
            front.cluster.generate(prompt, 2)
        assert front.cluster.stats().routed == {0: 0} and front.replicas[0].stats.requests == 0


def test_an_error_its_replica_raises_is_that_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: ReplicaCluster.generate re-raised Ray's wrapper of a replica engine's refusal (RayTaskError; on real
    Ray its text a remote traceback with colour codes, tests/cluster/test_cluster_ray.py), where ClusterEngine and
    Engine.generate raise the engine's own ValueError."""
    with inproc_front(monkeypatch, 1, "cache_aware", ENGINE) as front:
        with pytest.raises(ValueError) as refused:
            front.cluster.generate([1, 500], 2)
        assert type(refused.value) is ValueError
        assert str(refused.value) == "token id 500 is outside the vocabulary [0, 97)"
        assert front.cluster.loads.in_flight() == 0
