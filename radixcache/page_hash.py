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

from radixcache.tokens import TOKEN_TYPECODE

HASH_BYTES = 16
_ROOT_TAG = b"radixcache-page-v1\0"


def root_hash(fingerprint: str, namespace: Hashable = None) -> bytes:
    """The chain's root for one fingerprint and namespace. `repr` names the namespace: None, str, int and tuples of
    them (what the engine and the server use) have stable reprs across processes."""
    data = _ROOT_TAG + fingerprint.encode() + b"\0" + repr(namespace).encode()
    return blake2b(data, digest_size=HASH_BYTES).digest()


class PageChain:
    """The page hashes of one growing token sequence, computed once each as the sequence grows.

    Invariant: `hashes[i]` is the hash of page i of the tokens given so far; the tokens of a sequence never change
    (a request only appends), so a hash once computed stays valid.
    """

    __slots__ = ("hashes", "page_size", "root")

    def __init__(self, root: bytes, page_size: int) -> None:
        self.root = root
        self.page_size = page_size
        self.hashes: list[bytes] = []

    def upto(self, tokens: Sequence[int], pages: int) -> list[bytes]:
        """The hashes of the first `pages` full pages of `tokens` (which must hold them); computes only new ones."""
        have = len(self.hashes)
        if pages > have:
            p = self.page_size
            self.hashes.extend(chain_hashes(tokens[have * p : pages * p], p, self.hashes[-1] if have else self.root))
        return self.hashes[:pages]


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
