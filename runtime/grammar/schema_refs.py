"""A bound on how deep a JSON schema's subschemas nest once its `$ref`s are followed, checked before it is compiled.

llguidance compiles a schema by recursing into each subschema and into each `$ref`'s target, on the calling thread's
stack, and a schema too deep for that stack crashed the process (a segfault, the whole server with it). Written out,
a schema nests at most `MAX_DEPTH` levels (`schema_check`), but a chain of `$defs` each referring to the next is
shallow as JSON and as deep as it is long: on this machine's 8 MiB stacks a chain of 1,000 objects each holding the
next as a property (~90 KB of JSON) crashed, and of 3,000 bare `$ref`s, or 2,000 `anyOf` or `items` links.

`check_ref_depth` measures the depth in subschemas (a schema is one level, its `properties`, `items`, members of an
`anyOf`... the next, a `$ref`'s target the level after the schema holding it) and refuses one past `MAX_REF_DEPTH`
(256: the written-out bound is within it, and the shallowest crash above, 1,500 to 2,000 such levels, is 6 to 8
times it). A `$ref` back into a schema being followed is recursion, which the grammar follows lazily (a tree node's
children): it adds no depth. Each target is measured once (iteratively, so a chain of any length costs no Python
recursion).
"""

from __future__ import annotations

from typing import Any

from radixcache.runtime.grammar.errors import GrammarError

MAX_REF_DEPTH = 256
SUBSCHEMA = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames")
SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas")  # $defs are reached through their $refs
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")

# a target's own shape: its depth written out, and each $ref in it as (its level, the reference, its path inside)
_Local = tuple[int, list[tuple[int, str, str]]]


def check_ref_depth(schema: Any, path: str, limit: int = MAX_REF_DEPTH) -> None:
    """GrammarError at the `$ref` that starts the chain when `schema` nests more than `limit` levels of subschemas
    with its `$ref`s followed. Its references must resolve (`schema_check` checks that first)."""
    depth, first = _depth(schema)
    if depth > limit:
        raise GrammarError(
            f"its subschemas nest {depth:,} levels deep once its $refs are followed; at most {limit} are compiled "
            "(a deeper schema overflows the grammar compiler's stack)",
            path + first,
        )


def _depth(root: Any) -> tuple[int, str]:
    """The depth of `root` with its references followed, and the path (inside it) of the `$ref` the deepest chain
    takes first ("" when no reference is on it)."""
    local: dict[str, _Local] = {}

    def shape(ref: str) -> _Local:
        if ref not in local:
            local[ref] = _shape(resolve_ref(root, ref))
        return local[ref]

    height: dict[str, tuple[int, str]] = {}  # a measured target: its depth, the path of its deepest first $ref
    # frames: [reference, index of its next $ref, its depth so far, that depth's first $ref path]
    stack: list[list[Any]] = [["#", 0, shape("#")[0], ""]]
    following = {"#"}
    while stack:
        frame = stack[-1]
        refs = shape(frame[0])[1]
        if frame[1] < len(refs):
            level, ref, at = refs[frame[1]]
            frame[1] += 1
            if ref in height:
                _deepen(frame, level + height[ref][0], at)
            elif ref not in following:  # one being followed is recursion: no depth of its own
                stack.append([ref, 0, shape(ref)[0], ""])
                following.add(ref)
            continue
        stack.pop()
        following.discard(frame[0])
        height[frame[0]] = (frame[2], frame[3])
        if stack:
            parent = stack[-1]
            level, _, at = shape(parent[0])[1][parent[1] - 1]
            _deepen(parent, level + frame[2], at)
    return height["#"]


def _deepen(frame: list[Any], depth: int, at: str) -> None:
    if depth > frame[2]:
        frame[2], frame[3] = depth, f"{at}.$ref"


def _shape(node: Any) -> _Local:
    """`node`'s depth as written (a schema alone: 1) and its `$ref`s, without following them."""
    deepest, refs = 0, []
    stack = [(node, 1, "")]
    while stack:
        item, level, at = stack.pop()
        if not isinstance(item, dict):
            continue
        deepest = max(deepest, level)
        if isinstance(item.get("$ref"), str):
            refs.append((level, item["$ref"], at))
        for key in SUBSCHEMA:
            if isinstance(item.get(key), dict):
                stack.append((item[key], level + 1, f"{at}.{key}"))
        for key in SCHEMA_MAPS:
            if isinstance(item.get(key), dict):
                stack.extend((sub, level + 1, f"{at}.{key}.{name}") for name, sub in item[key].items())
        for key in SCHEMA_LISTS:
            if isinstance(item.get(key), list):
                stack.extend((sub, level + 1, f"{at}.{key}[{i}]") for i, sub in enumerate(item[key]))
    return deepest, refs


def ref_path(ref: str) -> tuple[str, ...]:
    """A local `$ref` as the path of keys it names (`schema_check` refuses any other kind)."""
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in ref[1:].split("/") if p)


def resolve_ref(root: Any, ref: str) -> Any:
    """The subschema a local `$ref` names in `root`; None where it names nothing."""
    target = root
    for part in ref_path(ref):
        if isinstance(target, dict):
            target = target.get(part)
        elif isinstance(target, list) and part.isdecimal() and int(part) < len(target):
            target = target[int(part)]
        else:
            return None
    return target
