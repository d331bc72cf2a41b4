"""The GGUF loader's thread pool is sized by the CPUs this process may use (its affinity, within its cgroup's
quota: radixcache.runtime.cores.usable_cores), not by the host's count: under `taskset -c 0`, or in a container held
to one CPU on a 64-core host, it started 8 dequantising threads on one CPU (`os.cpu_count()` says 64)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from radixcache.runtime import cores
from radixcache.runtime.loading import gguf_model


@pytest.mark.parametrize(
    ("affinity", "quota", "want"), [({0}, None, 1), (set(range(64)), 2.0, 2), ({0, 1, 2}, None, 3)]
)
def test_the_gguf_loader_uses_the_cpus_this_process_may_run_on(monkeypatch, affinity, quota, want) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the host's
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: affinity, raising=False)
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda *args: quota)
    monkeypatch.setattr(gguf_model, "check_gguf_tensors", lambda gguf, config: {})  # no tensor: the pool alone
    sizes: list[int] = []

    class Recorded(ThreadPoolExecutor):
        def __init__(self, max_workers: int) -> None:
            sizes.append(max_workers)
            super().__init__(max_workers)

    monkeypatch.setattr(gguf_model, "ThreadPoolExecutor", Recorded)
    assert gguf_model.load_gguf_weights(None, SimpleNamespace(arch="llama")) == {}  # type: ignore[arg-type]
    assert gguf_model.load_gguf_weights(None, SimpleNamespace(arch="llama"), threads=5) == {}  # type: ignore[arg-type]
    assert sizes == [want, 5]
