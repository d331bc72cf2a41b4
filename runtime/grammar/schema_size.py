"""A bound on a JSON schema's size, checked before it is compiled, naming the part that is too large.

llguidance's compile time grows faster than the schema: on this 2-core machine an enum of 60,000 strings took 9 s,
one of 100,000 about 20 s before the library refused it ("initial lexer configuration too big"), 10,000 required
properties 15 s, all on a worker thread per request; and a grammar past the compiler's cache bound (2**21 // 8
characters) is never kept, so it was compiled again for every request that sent it. `check_size` refuses a schema
of more than `MAX_SCHEMA_CHARS` characters of JSON (about: strings and keys exactly, other scalars as 4) at once,
with the path of the part that holds the bulk: it descends into the largest child while that child alone is over.
"""

from __future__ import annotations

from typing import Any

from radixcache.runtime.grammar.errors import GrammarError

MAX_SCHEMA_CHARS = 1 << 18  # what the default compiler keeps (GrammarCompiler's max_chars // 8)


def check_size(schema: Any, path: str, limit: int = MAX_SCHEMA_CHARS) -> None:
    """GrammarError naming the part of `schema` that makes it more than `limit` characters of JSON."""
    sizes = _sizes(schema)
    total = sizes.get(id(schema), 4)
    if total <= limit:
        return
    node, at = schema, path
    while True:
        children = _children(node, at)
        big = max(children, key=lambda c: sizes.get(id(c[0]), 0), default=None)
        if big is None or sizes.get(id(big[0]), 0) <= limit:
            break
        node, at = big
    raise GrammarError(
        f"the schema is about {total:,} characters of JSON, and this part of it {sizes[id(node)]:,}; at most "
        f"{limit:,} are compiled (a larger grammar takes seconds to build, for every request)",
        at,
    )


def bulk_path(schema: Any, path: str) -> str:
    """The path of the part of `schema` that holds most of it: the largest child, while that child alone is more than
    half of its parent (the library's "schema too large" names no part: an `allOf` of 1,000 objects, each small)."""
    sizes = _sizes(schema)
    node, at = schema, path
    while True:
        big = max(_children(node, at), key=lambda c: sizes.get(id(c[0]), 0), default=None)
        if big is None or 2 * sizes.get(id(big[0]), 0) <= sizes.get(id(node), 0):
            return at
        node, at = big


def _children(node: Any, path: str) -> list[tuple[Any, str]]:
    if isinstance(node, dict):
        return [(v, f"{path}.{k}") for k, v in node.items() if isinstance(v, (dict, list))]
    if isinstance(node, list):
        return [(v, f"{path}[{i}]") for i, v in enumerate(node) if isinstance(v, (dict, list))]
    return []


def _sizes(value: Any) -> dict[int, int]:
    """The approximate JSON length of every object and array in `value`, by id (iterative: no recursion limit)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, done = stack.pop()
        if not isinstance(item, (dict, list)):
            continue
        values = list(item.values()) if isinstance(item, dict) else item
        if not done:
            stack.append((item, True))
            stack.extend((v, False) for v in values if isinstance(v, (dict, list)) and id(v) not in sizes)
            continue
        total = 2 + sum(_scalar(v) if not isinstance(v, (dict, list)) else sizes.get(id(v), 0) for v in values)
        total += len(values)  # the separators
        if isinstance(item, dict):
            total += sum((len(k) if isinstance(k, str) else 4) + 3 for k in item)
        sizes[id(item)] = total
    return sizes


def _scalar(value: Any) -> int:
    return len(value) + 2 if isinstance(value, str) else 4
