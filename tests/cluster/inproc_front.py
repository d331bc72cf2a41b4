"""A front door (runtime.cluster.front.ClusterEngine) over real tiny replica engines run in this process by the
in-process Ray stand-in (tests/cluster/inproc_ray.py): `engine.replicas` holds the replicas' engines, for tests to
look inside. Closed, with every replica, when the context ends; the torch thread count is restored (a replica sets
its own)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.cluster.inproc_ray import install


@contextmanager
def inproc_front(monkeypatch: Any, replicas: int, router: str, engine_kwargs: dict[str, Any]) -> Iterator[Any]:
    ray = install(monkeypatch)
    from radixcache.runtime import loading
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    m = tiny_model(seed=7)
    tiny = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    monkeypatch.setattr(loading, "load_config_and_tokenizer", lambda model: (model.config, model.tokenizer))
    threads = torch.get_num_threads()
    cluster = ReplicaCluster(tiny, replicas, router=router, engine_kwargs=engine_kwargs, poll_interval=None)  # type: ignore[arg-type]
    engine = ClusterEngine(cluster, tiny)  # type: ignore[arg-type]
    engine.replicas = [actor.obj.engine for actor in ray.actors]
    try:
        yield engine
    finally:
        engine.close()
        for replica in engine.replicas:
            replica.close()
        torch.set_num_threads(threads)
