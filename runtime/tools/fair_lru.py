"""A least-recently-used map shared fairly by scopes (tenants, cache namespaces): one bound on all of them together,
and past it the scope holding the most loses its own least recently used entry.

Invariant, after every `put`: the entries number at most `max_entries` and weigh at most `max_weight`, unless the
entry just put is the only one left (the newest always stays). Each eviction takes the least recently used entry of
the scope that holds the most: by weight while only the weight bound is passed, else by count; a tie goes to the
scope putting now, then to the scope that has held entries the longest; the entry just put is never taken. So a
scope holding no more than its share (the bound over the scopes in use) keeps its entries however much another
puts. Not thread-safe: callers hold their own lock.

Used by the tool-call memory (runtime/tools/memory.py: bounded by entries and bytes), the legacy function-call
ids (runtime/server/legacy.py: by entries), the compiled grammars (runtime/grammar/compiler.py: by entries and
characters) and the stored responses (runtime/server/responses_store.py: by bytes, its scopes the API keys). The
first three keep their entries per cache namespace (the key holds it), shared by the namespace's tenant
(`fair_scope`): a namespace is the caller's, but a caller names as many as it likes (a new `cache_salt` per request
is a new namespace), so were each namespace a scope, a caller salting every request would hold a share per salt,
and flush the entries of every tenant holding no more than one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TenantNamespace(str):
    """A cache namespace that names its tenant: its value (a str: what page hashes, lookups and metrics see) is the
    namespace, `tenant` the scope its entries share the bounds under. The server's namespaces of API keys and salts
    are these (runtime.server.generation.namespace_for): each salt of a key is a namespace, all of them one tenant."""

    __slots__ = ("tenant",)
    tenant: Hashable

    def __new__(cls, namespace: str, tenant: Hashable) -> TenantNamespace:
        made = super().__new__(cls, namespace)
        made.tenant = tenant
        return made

    def __reduce__(self) -> tuple[type, tuple[str, Hashable]]:  # pickled (to a replica) with its tenant
        return TenantNamespace, (str.__str__(self), self.tenant)


def fair_scope(namespace: Hashable) -> Hashable:
    """The scope of `namespace`'s entries: its tenant (a TenantNamespace's), else the namespace itself (a Python API
    caller's `namespace=`, its only scope)."""
    return namespace.tenant if isinstance(namespace, TenantNamespace) else namespace


class FairLRU(Generic[K, V]):
    """Entries by (scope, key), each scope's in least-recently-used order (oldest first)."""

    def __init__(self, max_entries: int, max_weight: int | None = None) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        if max_weight is not None and max_weight < 1:
            raise ValueError(f"max_weight must be at least 1, got {max_weight}")
        self.max_entries = max_entries
        self.max_weight = max_weight
        self._scopes: dict[Hashable, OrderedDict[K, tuple[V, int]]] = {}
        self._scope_weight: dict[Hashable, int] = {}
        self._count = 0
        self.weight = 0  # all scopes together: what max_weight bounds

    def __len__(self) -> int:
        return self._count

    def keys(self) -> dict[Hashable, list[K]]:
        """Each scope's keys, least recently used first, the scopes in the order they began holding entries."""
        return {scope: list(space) for scope, space in self._scopes.items()}

    def held(self, scope: Hashable) -> tuple[int, int]:
        """How many entries `scope` holds, and their weight."""
        return len(self._scopes.get(scope, ())), self._scope_weight.get(scope, 0)

    def oldest(self, scope: Hashable) -> K | None:
        """The least recently used key of `scope`, or None when it holds none."""
        return next(iter(self._scopes.get(scope, ())), None)

    def get(self, scope: Hashable, key: K, touch: bool = True) -> V | None:
        """The value of `key` in `scope` (None when absent), made the scope's most recently used when `touch`."""
        space = self._scopes.get(scope)
        if space is None or key not in space:
            return None
        if touch:
            space.move_to_end(key)
        return space[key][0]

    def put(self, scope: Hashable, key: K, value: V, weight: int = 0) -> list[tuple[Hashable, K]]:
        """Set `key` in `scope` as its most recently used, then evict past the bounds (the module's invariant);
        returns the (scope, key) of each entry evicted, oldest first."""
        self.pop(scope, key)
        self._scopes.setdefault(scope, OrderedDict())[key] = (value, weight)
        self._scope_weight[scope] = self._scope_weight.get(scope, 0) + weight
        self._count += 1
        self.weight += weight
        evicted = []
        while self._count > 1 and (self._count > self.max_entries or self._over_weight()):
            victim = self._fullest(scope, by_weight=self._count <= self.max_entries)
            oldest = next(iter(self._scopes[victim]))
            self.pop(victim, oldest)
            evicted.append((victim, oldest))
        return evicted

    def pop(self, scope: Hashable, key: K) -> V | None:
        """Remove `key` from `scope`; its value, or None when it was not there."""
        space = self._scopes.get(scope)
        if space is None or key not in space:
            return None
        value, weight = space.pop(key)
        self._count -= 1
        self.weight -= weight
        self._scope_weight[scope] -= weight
        if not space:
            del self._scopes[scope], self._scope_weight[scope]
        return value

    def _over_weight(self) -> bool:
        return self.max_weight is not None and self.weight > self.max_weight

    def _fullest(self, putting: Hashable, by_weight: bool) -> Hashable:
        """The scope holding the most (weight, or entries) with an entry other than the one just put (the newest
        of `putting`); a tie goes to `putting`, then to the scope first in `_scopes` (held entries the longest)."""

        def held(scope: Hashable) -> tuple[int, bool]:
            amount = self._scope_weight[scope] if by_weight else len(self._scopes[scope])
            return amount, scope == putting

        # `put` evicts only while another entry than the newest exists, so this list is never empty
        candidates = [s for s, space in self._scopes.items() if s != putting or len(space) > 1]
        return max(candidates, key=held)
