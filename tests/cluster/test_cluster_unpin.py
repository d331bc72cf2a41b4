"""Pins through the front door: a request's `pin=` holds its prompt's pages on the replica that ran it, and
ClusterEngine.unpin releases them there, as Engine.unpin does on one engine (it had no unpin: a pin made through
replicas held its pages for good). Two real replica engines, run in this process by the in-process Ray stand-in."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.inproc_front import inproc_front

ENGINE = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64", "max_pinned_fraction": 0.5}


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with inproc_front(monkeypatch, 2, "round_robin", ENGINE) as engine:
        yield engine


def _pinned(front: Any) -> list[int]:
    return [replica.stats.pinned_blocks for replica in front.replicas]


def test_unpin_releases_a_pin_on_the_replica_that_holds_it(front: Any) -> None:
    a, b = list(range(1, 18)), list(range(30, 47))
    front.generate(a, 2, pin=True)
    front.generate(b, 2, pin=True, namespace="x")
    assert sorted(_pinned(front)) == [4, 4]  # round robin: one prompt's 4 whole pages on each replica
    assert front.unpin(b) == 0  # its pin is in namespace "x"
    assert front.unpin(b, namespace="x") == 1 and sorted(_pinned(front)) == [0, 4]
    assert front.unpin() == 1 and _pinned(front) == [0, 0]
    assert front.unpin() == 0
    with pytest.raises(ValueError, match="prompt"):
        front.unpin(b"abc")
    for replica in front.replicas:
        assert replica.check()["locked_blocks"] == 0


def test_unpin_of_a_namespace_alone_releases_only_its_pins_on_every_replica(front: Any) -> None:
    """As Engine.unpin: unpin(namespace="x") released every namespace's pins."""
    a, b = list(range(1, 18)), list(range(30, 47))
    front.generate(a, 2, pin=True)
    front.generate(b, 2, pin=True, namespace="x")
    assert front.unpin(namespace="x") == 1 and sorted(_pinned(front)) == [0, 4]
    assert front.unpin(namespace="x") == 0
    assert front.unpin() == 1 and _pinned(front) == [0, 0]


def test_unpin_naming_a_holder_releases_only_its_share_on_every_replica(front: Any) -> None:
    """A Session behind the front door is its pins' holder (`pin_holder`): ClusterEngine.unpin passed no holder to
    the replicas, so one session's unpin released every session's pin of the same history there."""
    a = list(range(1, 18))
    for holder in ("s1", "s1", "s2", "s2"):  # round robin: each replica holds one share of each
        assert front.generate(a, 2, pin=True, pin_holder=holder).pinned_tokens == 16
    assert _pinned(front) == [4, 4]
    assert front.unpin(a, pin_holder="s1") == 2 and _pinned(front) == [4, 4]  # s2's shares hold the pages
    assert front.unpin(a, pin_holder="s1") == 0
    assert front.unpin(a, pin_holder="s2") == 2 and _pinned(front) == [0, 0]
    for replica in front.replicas:
        assert replica.check()["locked_blocks"] == 0
