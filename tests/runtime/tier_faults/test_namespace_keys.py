"""A namespace's page keys are the same in every process (radixcache.page_hash.namespace_key): a frozenset's repr
follows str hashing, which changes per process (PYTHONHASHSEED), so a frozenset namespace never hit the disk after a
restart. Run in real subprocesses under different hash seeds (and this process); what has no stable name is refused
by name.
"""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixcache.page_hash import namespace_key, root_hash
from radixcache.runtime import Engine
from radixcache.runtime.testing import tiny_model

REPO = Path(__file__).resolve().parents[3]
SEEDS = ("1", "2", "3", "4", "5", "6")
_ROOT_CHILD = (
    "from radixcache.page_hash import root_hash\n"
    "print(root_hash('fp', frozenset({'alpha', 'beta', 'gamma', ('t', frozenset({'x', 'y'}))})).hex())"
)
NAMESPACE = frozenset({"alpha", "beta", "gamma"})
_ENGINE_CHILD = """
import sys
from radixcache.runtime import Engine
from radixcache.runtime.testing import tiny_model
with Engine(tiny_model(), capacity_blocks=200, page_size=4, cache_dir=sys.argv[1]) as engine:
    print(engine.generate(list(range(1, 41)), 1, namespace=frozenset({"alpha", "beta", "gamma"})).cached_tokens)
"""
_ORDER_CHILD = "print(repr(frozenset({'alpha', 'beta', 'gamma'})))"  # its order under the child's hash seed


def _run(code: str, seed: str, *args: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_frozenset_namespace_has_one_root_under_every_hash_seed() -> None:
    roots = {_run(_ROOT_CHILD, seed) for seed in SEEDS}
    assert len(roots) == 1


def test_a_frozenset_namespace_hits_the_disk_after_a_restart(tmp_path: Path) -> None:
    """Written by an engine in this process, read back by one in a process whose hash seed orders the namespace
    otherwise (seeds 1 and 2 order it differently: one of them differs from this process's order; asserted). The
    writer ran in a subprocess of its own too: one more interpreter start with torch, for the same check."""
    with Engine(tiny_model(), capacity_blocks=200, page_size=4, cache_dir=str(tmp_path)) as engine:
        assert engine.generate(list(range(1, 41)), 1, namespace=NAMESPACE).cached_tokens == 0
    seed = next(seed for seed in ("1", "2") if _run(_ORDER_CHILD, seed) != repr(NAMESPACE))
    assert _run(_ORDER_CHILD, seed) != repr(NAMESPACE)  # the old keys (repr) differ: a miss before the fix
    assert _run(_ENGINE_CHILD, seed, str(tmp_path)) == "39"


def test_the_common_namespaces_keep_their_keys() -> None:
    # keys written before namespace_key existed were repr(namespace): these stay valid
    for ns in (None, "tenant", "it's", 7, -3, 10**30, b"k", (), ("key", "salt"), ("a",), ("k", None, 3, ("x",))):
        assert namespace_key(ns) == repr(ns)
    assert namespace_key(frozenset({"a"})) == repr(frozenset({"a"}))


def test_equal_namespaces_share_a_root() -> None:
    class Tenant(enum.StrEnum):
        A = "a"

    assert root_hash("fp", 1) == root_hash("fp", True) == root_hash("fp", 1.0)
    assert root_hash("fp", 0.0) == root_hash("fp", -0.0) and root_hash("fp", Tenant.A) == root_hash("fp", "a")
    assert root_hash("fp", frozenset({"b", "a"})) == root_hash("fp", frozenset({"a", "b"}))
    assert root_hash("fp", "1") != root_hash("fp", 1) != root_hash("fp", b"1")
    assert root_hash("fp", (1, 2)) != root_hash("fp", frozenset({1, 2}))


def test_a_namespace_with_no_stable_name_is_refused_by_name() -> None:
    for ns in (object(), ("tenant", object())):
        with pytest.raises(ValueError, match="namespace of type object has no name"):
            root_hash("fp", ns)
    with Engine(tiny_model(), capacity_blocks=64, page_size=4, host_kv_memory=1 << 20) as engine:
        with pytest.raises(ValueError, match="namespace of type object has no name"):
            engine.generate(list(range(1, 9)), 1, namespace=object())
        assert engine.generate(list(range(1, 9)), 1, namespace="ok").cached_tokens == 0  # the engine goes on
    # without tiers nothing hashes pages: the device tree keeps any hashable namespace
    with Engine(tiny_model(), capacity_blocks=64, page_size=4) as engine:
        ns = object()
        engine.generate(list(range(1, 9)), 1, namespace=ns)
        assert engine.generate(list(range(1, 9)), 1, namespace=ns).cached_tokens > 0


def test_a_subclass_is_named_by_its_base_types_value() -> None:
    class Loud(str):
        def __str__(self) -> str:
            return "something else"

    class Odd(int):
        def __int__(self) -> int:
            return 99

    assert root_hash("fp", Loud("a")) == root_hash("fp", "a") and root_hash("fp", Odd(3)) == root_hash("fp", 3)
