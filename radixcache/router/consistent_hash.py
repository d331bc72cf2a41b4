"""Consistent hashing: a session (or a prompt's first pages) always goes to the same replica, and adding or
removing a replica moves only the keys that hashed to it (about 1/n of them)."""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Hashable, Sequence
from hashlib import blake2b

from radixcache.router.base import Router, check_replicas
from radixcache.router.errors import RouterError
from radixcache.router.index import RouterIndex
from radixcache.router.load import LoadTracker, RouteRequest


def stable_bytes(key: Hashable) -> bytes:
    """A key as bytes that are the same in every process (Python's `hash` of str and bytes is salted per run)."""
    if isinstance(key, bytes):
        return b"b" + key
    if isinstance(key, int) and not isinstance(key, bool):
        return b"i" + str(key).encode()
    if isinstance(key, str):
        return b"s" + _utf8(key)
    return b"r" + _utf8(repr(key))


def _utf8(text: str) -> bytes:
    """`text` as UTF-8, a lone surrogate (a str JSON's \\ud800 escape makes) included: the strict codec raised
    UnicodeEncodeError for it. The same bytes as strict UTF-8 for every other str, so no key moves on the ring."""
    return text.encode("utf-8", "surrogatepass")


def _point(data: bytes) -> int:
    return struct.unpack("<Q", blake2b(data, digest_size=8).digest())[0]


MAX_VNODES = 10_000  # points a replica: beyond a few hundred the balance gains nothing, and the ring costs memory


class ConsistentHashRouter(Router):
    """A hash ring with `vnodes` virtual nodes per replica. The request's key is its session id when it has one,
    else its first `prefix_pages` page keys (chained, so they name the prompt's first pages); it goes to the
    first virtual node at or after the key's point on the ring. Requests with neither a session nor a full page
    go round robin. The ring is rebuilt only when the routing set changes.

    Invariant: for a fixed routing set, equal keys go to equal replicas; removing a replica moves only the keys
    that were on it, and adding one takes only keys onto it.
    """

    name = "consistent_hash"

    def __init__(self, vnodes: int = 100, prefix_pages: int = 4) -> None:
        for name, value in (("vnodes", vnodes), ("prefix_pages", prefix_pages)):
            if type(value) is not int or value < 1:
                raise RouterError(f"consistent_hash: {name} must be a positive int, got {value!r}")
        if vnodes > MAX_VNODES:  # the ring holds vnodes points a replica, built whole on the first choice
            raise RouterError(f"consistent_hash: vnodes must be at most {MAX_VNODES:,}, got {vnodes:,}")
        self.vnodes = vnodes
        self.prefix_pages = prefix_pages
        self._members: tuple[int, ...] = ()
        self._points: list[int] = []
        self._owners: list[int] = []
        self._next = 0

    def choose(self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker) -> int:
        check_replicas(replicas)
        if request.session is not None:
            data = b"session\0" + _utf8(request.session)
        elif request.page_keys:
            data = b"\0".join(stable_bytes(k) for k in list(request.page_keys[: self.prefix_pages]))
        else:
            replica = replicas[self._next % len(replicas)]
            self._next += 1
            return replica
        return self.owner(_point(data), replicas)

    def owner(self, point: int, replicas: Sequence[int]) -> int:
        """The replica owning `point` on the ring of `replicas` (a RouterError for none)."""
        members = tuple(sorted(set(replicas)))
        if not members:
            raise RouterError("consistent_hash: no replicas to own a point")
        if members != self._members:
            ring = sorted((_point(f"{r}#{v}".encode()), r) for r in members for v in range(self.vnodes))
            self._points = [p for p, _ in ring]
            self._owners = [r for _, r in ring]
            self._members = members
        at = bisect_left(self._points, point)
        return self._owners[at % len(self._owners)]

    def __repr__(self) -> str:
        return f"ConsistentHashRouter(vnodes={self.vnodes!r}, prefix_pages={self.prefix_pages!r})"
