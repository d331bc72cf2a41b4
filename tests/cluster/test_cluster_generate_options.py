"""ReplicaCluster.generate (the Python API's blocking call) given `options=`: it passed `namespace=None` beside them,
which overrode the options' namespace (the replica cached the prompt under None, and the router hashed it with
None), and its default `max_new_tokens=64` overrode the options' length. The options are resolved at the front door
as every entry point resolves them (keywords over `options`). The real replica class, in-process
(tests/cluster/inproc_front.py)."""

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
