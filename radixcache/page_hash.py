"""Chained page hashes: the content address of a page of KV in the host and disk tiers.

The hash of page i is blake2b(hash of page i-1 || the page's token ids), 16 bytes, and page 0 chains on a *root*
that hashes a fingerprint (everything that makes KV bytes reusable: weights, weight format, KV dtype, page size,
layout, rope settings) together with the namespace. So a page's hash names its whole prefix, its model and its
tenant: two runs that differ in any of those never share a key (the failures users report with HiCache keys that
omit the dtype or the tenant). Readers still compare the page's own token ids, never trusting a hash alone.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence
from hashlib import blake2b
from typing import Any

from radixcache.tokens import TOKEN_TYPECODE

HASH_BYTES = 16
MAX_CACHED_ROOTS = 256  # a PageHasher keeps the roots of at most this many namespaces
_ROOT_TAG = b"radixcache-page-v1\0"


def root_hash(fingerprint: str, namespace: Hashable = None) -> bytes:
    """The chain's root for one fingerprint and namespace (namespace_key names the namespace)."""
    data = _ROOT_TAG + fingerprint.encode() + b"\0" + namespace_key(namespace).encode()
    return blake2b(data, digest_size=HASH_BYTES).digest()


def namespace_key(namespace: Hashable) -> str:
    """A namespace's name in the page keys, the same in every process: None, and str, bytes, int, float, tuples and
    frozensets of them (subclasses by their base type's value: a StrEnum member equals its string to the tree). It
    is `repr` for None, str, bytes, int and tuples of them (the keys written before this rule stay valid); a
    frozenset's members are sorted by their own keys (its repr's order follows str hashing, which changes per
    process); equal numbers get one key (1, 1.0 and True are one namespace to the tree; -0.0 is 0). Anything else is
    a ValueError naming its type: an object's repr can hold its address (another key in the next process, and a
    later object's once it is freed)."""
    if namespace is None:
        return "None"
    if isinstance(namespace, str):
        return repr(str.__str__(namespace))  # the base type's value: a subclass's __str__ is its own
    if isinstance(namespace, bytes):
        return repr(bytes(memoryview(namespace)))
    if isinstance(namespace, int):
        return repr(int.__int__(namespace))
    if isinstance(namespace, float):
        number = float.__float__(namespace)
        return repr(int(number)) if number.is_integer() else repr(number)
    if isinstance(namespace, tuple):
        keys = [namespace_key(x) for x in namespace]
        return "(" + ", ".join(keys) + ("," if len(keys) == 1 else "") + ")"
    if isinstance(namespace, frozenset):
        keys = sorted(namespace_key(x) for x in namespace)
        return "frozenset({" + ", ".join(keys) + "})" if keys else "frozenset()"
    raise ValueError(
        f"namespace of type {type(namespace).__name__} has no name that is the same in every process (page keys, "
        "of the host and disk tiers and of KV events, need one): use None, str, bytes, int, float, or tuples and "
        "frozensets of them"
    )


class PageChain:
    """The page hashes of one growing token sequence, computed once each as the sequence grows.

    Invariant: `hashes[i]` is the hash of page i of the tokens given so far; the tokens of a sequence never change
    (a request only appends), so a hash once computed stays valid. `hashes` only grows (never replaced): the
    DeferredHashes it hands out read it from other threads, and `upto` takes the hashes they computed, so a run is
    hashed once whoever needs it first (a tier's refresh, or the request's next commit).
    """

    __slots__ = ("_later", "hashes", "page_size", "root")

    def __init__(self, root: bytes, page_size: int) -> None:
        self.root = root
        self.page_size = page_size
        self.hashes: list[bytes] = []
        self._later: DeferredHashes | None = None  # the last one handed out, until the chain is past it

    def upto(self, tokens: Sequence[int], pages: int) -> list[bytes]:
        """The hashes of the first `pages` full pages of `tokens` (which must hold them); computes only new ones."""
        have = len(self.hashes)
        if pages > have:
            later = self._later
            if later is not None:
                done = later.done  # what it computed meanwhile (on any thread), None if not called yet
                if done is not None and len(done) > have:
                    self.hashes.extend(done[have:pages])
                    have = len(self.hashes)
                if done is not None or pages >= len(later):
                    self._later = None
        if pages > have:
            p = self.page_size
            self.hashes.extend(chain_hashes(tokens[have * p : pages * p], p, self.hashes[-1] if have else self.root))
        return self.hashes[:pages]

    def deferred(self, tokens: Sequence[int], pages: int) -> list[bytes] | DeferredHashes:
        """The hashes of the first `pages` full pages when computed, else a DeferredHashes that computes them (those
        the chain lacks then, from a copy of their tokens) when called, leaving the chain as it is (another thread may
        call it: a disk tier's writer); the chain's next `upto` takes what it computed."""
        have, p = min(len(self.hashes), pages), self.page_size
        if have == pages:
            return self.hashes[:pages]
        later = self._later = DeferredHashes(self.hashes, have, tokens[have * p : pages * p], p, self.root)
        return later


class DeferredHashes:
    """The hashes of a sequence's first pages, computed when called: `len` of them (PageChain.deferred). Those the
    chain holds by then are taken from it (it only grows), the rest hashed from the copied tokens; `done` keeps the
    answer (the chain's `upto` takes it)."""

    __slots__ = ("_chain", "_page_size", "_rest", "_root", "_start", "done")

    def __init__(self, chain: list[bytes], start: int, rest: Sequence[int], page_size: int, root: bytes) -> None:
        self._chain, self._start, self._rest, self._page_size, self._root = chain, start, rest, page_size, root
        self.done: list[bytes] | None = None

    def __len__(self) -> int:
        rest = self._rest  # before `done`, as in `__call__`
        done = self.done
        return len(done) if done is not None else self._start + len(rest) // self._page_size

    def __call__(self) -> list[bytes]:
        rest = self._rest  # before `done`: `done` is set before `_rest` is let go (two threads may both call)
        done = self.done
        if done is None:
            p, pages = self._page_size, len(rest) // self._page_size + self._start
            known = self._chain[:pages]  # a snapshot: the chain may grow meanwhile, past `_start`, never shrink
            known += chain_hashes(rest[(len(known) - self._start) * p :], p, known[-1] if known else self._root)
            done = self.done = known
            self._rest = ()  # its tokens are not needed any more
        return done


def chain_hashes(tokens: Sequence[int], page_size: int, parent: bytes) -> list[bytes]:
    """Hashes of the full pages of `tokens`, chained on `parent` (the root, or the hash of the page before)."""
    pages = len(tokens) // page_size
    if pages == 0:
        return []
    data = array(TOKEN_TYPECODE, tokens[: pages * page_size]).tobytes()  # int64, native order: ids are validated
    step = page_size * 8
    out: list[bytes] = []
    prev = parent
    for start in range(0, pages * step, step):
        prev = blake2b(prev + data[start : start + step], digest_size=HASH_BYTES).digest()
        out.append(prev)
    return out


def page_hashes(
    tokens: Sequence[int], page_size: int, fingerprint: str = "", namespace: Hashable = None
) -> list[bytes]:
    """The hashes of every full page of `tokens` from the start of a sequence."""
    return chain_hashes(tokens, page_size, root_hash(fingerprint, namespace))


class PageHasher:
    """The page hashes of one fingerprint at one page size: roots per namespace, fresh chains, a prompt's keys, and a
    tree node's own pages.

    Roots are cached for at most MAX_CACHED_ROOTS namespaces, the oldest cached dropped first, so per-tenant salts
    that come and go leave a bounded cache. A hit costs one dict lookup, as before the bound; a dropped root is
    recomputed (one blake2b) when its namespace comes back.

    One instance serves every consumer of an engine's keys (the tiers, the event log, a front door), so a leaf that
    two eviction listeners both hash is hashed once: `node_hashes` keeps its last answer, which stays right while the
    node's span is unchanged (a listener runs before the tree trims or detaches the leaf).
    """

    __slots__ = ("_last", "_roots", "fingerprint", "page_size")

    def __init__(self, fingerprint: str, page_size: int) -> None:
        self.fingerprint = fingerprint
        self.page_size = page_size
        self._roots: dict[Hashable, bytes] = {}  # insertion order: the oldest first
        self._last: tuple[object, int, int, list[bytes]] | None = None

    def root(self, namespace: Hashable) -> bytes:
        root = self._roots.get(namespace)
        if root is None:
            roots = self._roots
            if len(roots) >= MAX_CACHED_ROOTS:
                del roots[next(iter(roots))]
            root = roots[namespace] = root_hash(self.fingerprint, namespace)
        return root

    def chain(self, namespace: Hashable) -> PageChain:
        """A fresh chain for one growing sequence of `namespace` (keep one per request)."""
        return PageChain(self.root(namespace), self.page_size)

    def hashes(self, tokens: Sequence[int], namespace: Hashable = None) -> list[bytes]:
        """The keys of every full page of `tokens`."""
        return chain_hashes(tokens, self.page_size, self.root(namespace))

    def node_hashes(self, node: Any) -> list[bytes]:
        """The keys of a tree node's own pages (its whole path is hashed: a key names its prefix)."""
        last = self._last
        if last is not None and last[0] is node and last[1] == node.prefix_len and last[2] == len(node.key):
            return last[3]
        p = self.page_size
        out = chain_hashes(node.tokens(), p, self.root(node.namespace))[node.prefix_len // p :]
        self._last = (node, node.prefix_len, len(node.key), out)
        return out
