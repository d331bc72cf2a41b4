"""A schema whose `$ref`s chain deeper than the grammar compiler's stack holds is refused before it is compiled: a
chain of 1,000 `$defs`, each an object holding the next as a property (~90 KB of JSON, within every size bound),
crashed the process in llguidance's compile (a segfault: one request took the server down). The depth counted is
an independent recursive walk's on acyclic schemas; recursion (a `$ref` back into a schema being followed) adds
none, so recursive schemas (a tree's nodes) still compile."""

from __future__ import annotations

import random
from typing import Any

import pytest

from radixcache.runtime.grammar import GrammarCompiler, GrammarError, GrammarSpec, GrammarState
from radixcache.runtime.grammar.schema_check import check_schema
from radixcache.runtime.grammar.schema_refs import MAX_REF_DEPTH, check_ref_depth

ROOT = "response_format.json_schema.schema"


def _chain(links: int, link: Any) -> dict[str, Any]:
    defs = {f"d{i}": link(f"#/$defs/d{i + 1}") for i in range(links)}
    defs[f"d{links}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _property(ref: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"x": {"$ref": ref}}, "required": ["x"]}


LINKS = {
    "property": _property,
    "alias": lambda ref: {"$ref": ref},
    "anyOf": lambda ref: {"anyOf": [{"$ref": ref}, {"type": "null"}]},
    "items": lambda ref: {"type": "array", "items": {"$ref": ref}, "maxItems": 1},
    "allOf": lambda ref: {"allOf": [{"$ref": ref}]},
}


@pytest.mark.parametrize("kind", sorted(LINKS))
def test_a_chain_of_refs_deeper_than_the_bound_is_refused_at_its_first_ref(kind: str) -> None:
    with pytest.raises(GrammarError, match="once its \\$refs are followed") as info:
        GrammarSpec.json_schema(_chain(2_000, LINKS[kind]), path=ROOT)
    assert info.value.path == f"{ROOT}.$ref"


def test_the_crashing_chain_is_refused_where_it_starts_inside_the_schema() -> None:
    defs = _chain(1_000, _property)["$defs"]
    schema = {"$defs": defs, "type": "object", "properties": {"a": {"type": "string"}, "b": {"$ref": "#/$defs/d0"}}}
    with pytest.raises(GrammarError, match="2,003 levels deep") as info:  # b, then 1,000 links of 2, then an integer
        GrammarSpec.json_schema(schema, path=ROOT)
    assert info.value.path == f"{ROOT}.properties.b.$ref"
    with pytest.raises(GrammarError) as info:  # a tool's parameters go through the same check
        check_schema(schema, "tools[0].function.parameters")
    assert info.value.path == "tools[0].function.parameters.properties.b.$ref"


def test_a_chain_within_the_bound_and_a_recursive_schema_compile(tiny_compiler: GrammarCompiler) -> None:
    links = (MAX_REF_DEPTH - 2) // 2  # the root and the last target are a level each, every link two
    check_ref_depth(_chain(links, _property), ROOT)
    with pytest.raises(GrammarError):
        check_ref_depth(_chain(links + 1, _property), ROOT)
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    }
    mutual = {  # a cycle of 600 definitions is as deep as it is long: refused
        "$defs": {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{(i + 1) % 600}"}, {"type": "null"}]} for i in range(600)},
        "$ref": "#/$defs/d0",
    }
    for schema in (tree, _chain(60, _property)):
        GrammarState(tiny_compiler.compile(GrammarSpec.json_schema(schema, path=ROOT)))
    with pytest.raises(GrammarError, match="once its \\$refs are followed"):
        GrammarSpec.json_schema(mutual, path=ROOT)


def _naive_depth(node: Any, root: dict[str, Any]) -> int:
    """Depth in subschemas with every `$ref` followed, by plain recursion (acyclic schemas only)."""
    if not isinstance(node, dict):
        return 0
    children = [node[k] for k in ("items", "additionalProperties", "not") if isinstance(node.get(k), dict)]
    children += list(node.get("properties", {}).values())
    children += [m for k in ("anyOf", "oneOf", "allOf") for m in node.get(k, [])]
    depth = 1 + max((_naive_depth(c, root) for c in children), default=0)
    if "$ref" in node:
        depth = max(depth, 1 + _naive_depth(root["$defs"][node["$ref"].rsplit("/", 1)[1]], root))
    return depth


def _random_schema(rng: random.Random, defs: int) -> dict[str, Any]:
    """A random acyclic schema: definition i refers only to definitions after it."""

    def sub(i: int, budget: int) -> dict[str, Any]:
        roll = rng.random()
        if budget == 0 or roll < 0.2:
            return {"type": "integer"}
        if roll < 0.45 and i + 1 < defs:
            return {"$ref": f"#/$defs/d{rng.randrange(i + 1, defs)}"}
        if roll < 0.65:
            return {"type": "object", "properties": {f"p{k}": sub(i, budget - 1) for k in range(rng.randint(1, 3))}}
        if roll < 0.8:
            return {"type": "array", "items": sub(i, budget - 1)}
        return {"anyOf": [sub(i, budget - 1) for _ in range(rng.randint(1, 3))]}

    schema: dict[str, Any] = {"$defs": {f"d{i}": sub(i, 4) for i in range(defs)}}
    schema.update(sub(-1, 4))
    return schema


@pytest.mark.parametrize("seed", range(40))
def test_the_depth_counted_is_a_plain_recursive_walks(seed: int) -> None:
    rng = random.Random(seed)
    schema = _random_schema(rng, rng.randint(2, 40))
    expected = _naive_depth({k: v for k, v in schema.items() if k != "$defs"}, schema)
    check_ref_depth(schema, ROOT, limit=expected)
    with pytest.raises(GrammarError, match=f"nest {expected:,} levels"):
        check_ref_depth(schema, ROOT, limit=expected - 1)
