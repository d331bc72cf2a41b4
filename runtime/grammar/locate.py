"""Where in a JSON schema the grammar library's refusal lies.

The library reports a schema it refuses (an unsatisfiable one, an unknown `format`) without a path, and for a nested
cause only the outermost symptom: `{"properties": {"a": {"properties": {"b": {"minimum": 5, "maximum": 1}}, ...}}}`
gave "required property 'a' is unsatisfiable" at the schema's root. `locate` compiles the subschemas one by one
(each with the root's `$defs` and `definitions`, which its `$ref`s point into) and follows the ones the library
refuses on their own, down to the deepest: its path, and the library's message for it ("minimum (5) is greater
than maximum (1)" at `...properties.a.properties.b`). A refusal that no subschema gives alone (the members of an
`allOf` that contradict each other) stays where the walk stopped. Only ever run for a refused schema, and bounded
(`MAX_TRIES` compiles, `BUDGET_S` seconds): the library refuses an unsatisfiable schema before it builds a lexer,
but a subschema it takes can take a second to compile (an enum of 100,000 strings), and 64 of them in one schema
would hold a worker thread for a minute before the 400 was sent.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from radixcache.runtime.grammar.errors import GrammarError
from radixcache.runtime.grammar.one_sided import one_sided_message
from radixcache.runtime.grammar.schema_check import (
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SUBSCHEMA,
    check_schema,
)
from radixcache.runtime.grammar.schema_size import bulk_path

MAX_TRIES = 64
BUDGET_S = 0.5
DEFS = ("$defs", "definitions")
_ONE_OF = "oneOf constraints are not supported"  # the library's words for members it cannot prove exclusive
_NAMED_KEYWORD = re.compile(r"Value for '([^']+)'")  # the library's wording when a keyword's value is refused


def locate(root: Any, path: str, message: str, error_of: Callable[[Any], str | None]) -> tuple[str, str]:
    """(path, message) of the deepest subschema of `root` (refused with `message`) that `error_of` refuses alone;
    (`path`, `message`) when none does. `error_of(schema)` is the library's message for a schema, None when taken.
    Within that subschema the path goes on to the keyword the message names ("Value for 'multipleOf' has too many
    digits": `.multipleOf`; a `oneOf` whose members may overlap: `.oneOf`; a required property its `properties` do
    not name, in an object closed to them: `.required`, saying so), or for "schema too large" to the part that holds
    its bulk (`.allOf`); a one-sided bound of magnitude 10**18 or more, which the library cannot build, to its keyword
    (`.minimum`), saying what to add."""
    node, path, message = _deepest(root, path, message, error_of)
    if (name := unnamed_required(node, message)) is not None:  # the library names it, not why
        message += (
            f": {name!r} is required but not among the object's properties, and the object admits no other key "
            "(additionalProperties false, or strict mode without additionalProperties): add it to its properties"
        )
    if (bound := one_sided_bound(node, message)) is not None:
        side, keyword = bound
        path, message = (
            (path if keyword is None else f"{path}.{keyword}"),
            one_sided_message("an integer" if "integer range" in message else "a number", side),
        )
        return path, message
    return _keyword_path(node, path, message), message


_ONE_SIDED = re.compile(r"Failed to generate regex for (integer|float) range: min=(\S+), max=(\S+)")


def one_sided_bound(node: Any, message: str) -> tuple[str, str | None] | None:
    """("lower" or "upper", the keyword of `node` that holds it, None when `node` holds none) when `message` is the
    library's refusal of a one-sided range of magnitude 10**18 or more (`{"type": "integer", "minimum": 1e18}`: it
    builds such a range's regex only below 10**18); None for any other message."""
    found = _ONE_SIDED.search(message)
    if found is None:
        return None
    side = "lower" if found.group(3) == "None" else "upper"
    keys = ("minimum", "exclusiveMinimum") if side == "lower" else ("maximum", "exclusiveMaximum")
    held = [k for k in keys if isinstance(node, dict) and isinstance(node.get(k), (int, float))]
    pick = max if side == "lower" else min  # the bound in force, where both keywords are given
    return side, (pick(held, key=lambda k: node[k]) if held else None)


def _keyword_path(node: Any, path: str, message: str) -> str:
    named = _NAMED_KEYWORD.search(message)
    if named and isinstance(node, dict) and named.group(1) in node:
        return f"{path}.{named.group(1)}"
    if "schema too large" in message:
        return bulk_path(node, path)
    if message.startswith(_ONE_OF) and isinstance(node, dict) and "oneOf" in node:
        return f"{path}.oneOf"
    if unnamed_required(node, message) is not None:
        return f"{path}.required"
    return path


_REQUIRED = re.compile(r"required property '([^']*)' is unsatisfiable")


def unnamed_required(node: Any, message: str) -> str | None:
    """The name the library calls an unsatisfiable required property when `node` requires it without naming it in
    its `properties` (strict mode closes such an object to the names it gives, so the name can never be written);
    None otherwise."""
    found = _REQUIRED.search(message)
    if found is None or not isinstance(node, dict) or not isinstance(node.get("required"), list):
        return None
    name = found.group(1)
    named = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    return name if name in node["required"] and name not in named else None


def _deepest(root: Any, path: str, message: str, error_of: Callable[[Any], str | None]) -> tuple[Any, str, str]:
    """(node, path, message) of the deepest subschema `error_of` refuses alone (`root` itself when none does)."""
    defs = {k: root[k] for k in DEFS if isinstance(root, dict) and isinstance(root.get(k), dict)}
    node, root_path, tries, seen = root, path, 0, {id(root)}
    deadline = time.monotonic() + BUDGET_S
    while True:
        for sub, sub_path in _children(node, path, root, root_path):
            # a boolean child is no culprit: `false` is refused alone, but fine as additionalProperties or items
            if not isinstance(sub, dict) or id(sub) in seen or id(_target(sub, root)) in seen:
                continue  # a $ref back to a schema the walk is inside fails as that schema does: no deeper cause
            if tries >= MAX_TRIES or time.monotonic() > deadline:
                return node, path, message
            tries += 1
            standalone = {**defs, **sub}
            try:  # a $ref it holds that points outside the root's defs: not compiled alone, not followed
                check_schema(standalone, sub_path)
            except GrammarError:
                continue
            if (refused := error_of(standalone)) is not None:
                seen.add(id(sub))
                node, path, message = sub, sub_path, refused
                break
        else:
            return node, path, message


def _children(node: Any, path: str, root: Any, root_path: str) -> Iterator[tuple[Any, str]]:
    """The subschemas of `node` with their paths: properties and the like, `items`, the members of `anyOf` and the
    like, and the target of its local `$ref` (by the target's own path, from `root_path`)."""
    if not isinstance(node, dict):
        return
    for key in SCHEMA_MAPS:
        if key not in DEFS and isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                yield sub, f"{path}.{key}.{name}"
    for key in SUBSCHEMA:
        if isinstance(node.get(key), (dict, bool)):
            yield node[key], f"{path}.{key}"
    for key in (*SCHEMA_LISTS, "items"):
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield sub, f"{path}.{key}[{i}]"
    target = _target(node, root)
    if target is not None:
        yield target, "".join([root_path, *(f".{p}" for p in _parts(node["$ref"]))])


def _parts(ref: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")]


def _target(node: dict[str, Any], root: Any) -> Any:
    """The schema `node`'s local `$ref` points to (`#/...`, not the root itself), or None."""
    ref = node.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    target = root
    for part in _parts(ref):
        target = target.get(part) if isinstance(target, dict) else None
    return target
