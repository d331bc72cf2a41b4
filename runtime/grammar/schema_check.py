"""A structural check of a JSON schema that names the path of the first mistake.

The grammar library reports an invalid schema without saying where it is; this walk finds the usual mistakes first
(an unknown `type`, a `$ref` that points nowhere, a `required` that is not a list of names, a bad `pattern` or
one too large to compile (`regex_size`, also a `patternProperties` name), a negative length, a number past 64 bits,
an integer no 64-bit float holds where the grammar writes it or bounds by it, a one-sided bound past
10**18, in its own schema or split across an `allOf` (`one_sided`), a string length past a 32-bit count, a schema too
large to compile:
`schema_size`, or too deep with its `$ref`s followed: `schema_refs`) and raises `GrammarError` with the path,
e.g. `response_format.json_schema.schema.properties.age.type`.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

import llguidance

from radixcache.runtime.grammar.errors import GrammarError
from radixcache.runtime.grammar.one_sided import one_sided_refusal
from radixcache.runtime.grammar.regex_size import check_regex_size
from radixcache.runtime.grammar.schema_refs import check_ref_depth
from radixcache.runtime.grammar.schema_size import check_size
from radixcache.runtime.grammar.schema_walk import DATA_KEYWORDS, SCHEMA_MAPS, schema_objects
from radixcache.runtime.tools.json_values import non_finite_path

TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
SUBSCHEMA = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
# llguidance's parser follows at most 2,000 items in one row, ~4 per optional property: an object of more fails
# once the output enters it, and compiling it costs time that grows faster than its size (3,000: 14 s here)
MAX_OPTIONAL = 500
MAX_DEPTH = 120  # objects and arrays: the library's JSON parser refuses past about 124 (its 128, less its wrapping)


def check_schema(schema: Any, path: str, *, enforced: bool = True) -> None:
    """Raise `GrammarError(path=...)` at the first structural mistake in `schema`. `enforced=False`: a schema no
    grammar will enforce (a tool's parameters, only shown to the model while no grammar forces a call), whose
    integers need not be ones the grammar library writes exactly."""
    if nests_deeper_than(schema, MAX_DEPTH):
        raise GrammarError(f"nests more than {MAX_DEPTH} levels of objects and arrays", path)
    check_size(schema, path)  # before the walks below, which cost seconds for a schema of megabytes
    if (found := _not_json(schema, path)) is not None:  # the Python API's: canonical JSON raised a TypeError
        raise GrammarError(*found)
    if (where := non_finite_path(schema, path)) is not None:  # the library reads NaN as null: {"const": NaN} forced
        raise GrammarError("NaN and Infinity are not JSON numbers", where)  # the answer {"x": null}
    _check(schema, path, schema)
    check_ref_depth(schema, path)  # its references resolve (`_check`): a chain of them deep enough crashed the process
    if (where := _out_of_range(schema, path)) is not None:
        raise GrammarError("numbers must be above -2**63, and integers fit in 64 bits", where)
    if enforced and (found := _inexact_integer(schema, path) or one_sided_refusal(schema, path)) is not None:
        raise GrammarError(*found)
    if enforced and (where := _uncountable_length(schema, path)) is not None:
        fix = "leave it out for no bound" if where.endswith("maxLength") else "no output can be that long"
        raise GrammarError(
            f"the grammar counts a string's length only up to {MAX_LENGTH_COUNT} (a 32-bit count): {fix}", where
        )


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests more than `limit` objects and arrays. Iterative: the walks of schemas, tools and bodies
    (canonical forms, checks, closing objects, json.dumps) recurse per level, and would hit Python's recursion
    limit; this check runs before them (here and on the server's request bodies)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


JSON_SCALARS = (str, int, float, bool, type(None))


_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str, a pair's halves are one character: these are alone


def _not_json(value: Any, path: str) -> tuple[str, str] | None:
    """(message, path) of the first part of `value` that is no JSON: a key that is not a string (`{1: ...}`), a
    value that is no JSON value (bytes, a set, an object), a key or string holding a lone surrogate (JSON's
    `"\\ud800"`, which no UTF-8 text holds: the library refused it naming only the schema's root, "Value is not JSON
    serializable", or, in an optional property's name, took a key no output could write); None when it is all JSON
    (tuples read as arrays)."""
    stack = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            if (key := next((k for k in item if not isinstance(k, str)), None)) is not None:
                return f"an object key must be a string, not {type(key).__name__} {key!r}", at
            if (key := next((k for k in item if _SURROGATE.search(k)), None)) is not None:
                where = f"{at}.{json.dumps(key)[1:-1]}"  # escaped: an error body holding it could not be encoded
                return f"a lone surrogate in {key!r} (half a UTF-16 pair) is not valid Unicode", where
            stack.extend((v, f"{at}.{k}") for k, v in reversed(item.items()))
        elif isinstance(item, (list, tuple)):
            stack.extend((v, f"{at}[{i}]") for i, v in reversed(list(enumerate(item))))
        elif isinstance(item, str) and _SURROGATE.search(item):
            return f"a lone surrogate in {item[:40]!r} (half a UTF-16 pair) is not valid Unicode", at
        elif not isinstance(item, JSON_SCALARS):
            return f"not a JSON value: {type(item).__name__}", at
    return None


def _out_of_range(value: Any, path: str) -> str | None:
    """The path of the first number in `value` (a `default`, an `enum` value: data too) the library cannot take: an
    int past 64 bits ("Value is not JSON serializable", no path), or a number it reads as a float at or below -2**63
    (an integer `const` or `enum` of -2**63 + 1 or -1e19 crashes the process)."""
    stack = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, int) and not (-(2**63) < item < 2**64 and float(item) > -(2.0**63)):
            return at
        if isinstance(item, float) and item <= -(2.0**63):
            return at
        if isinstance(item, dict):
            stack.extend((v, f"{at}.{k}") for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


MAX_LENGTH_COUNT = 2**32 - 1  # the library writes a string's length bounds as a regex count, a 32-bit number
# keywords whose subschemas the library never compiles: refused in strict mode by name, ignored under strict: false
UNENFORCED = ("not", "if", "then", "else", "contains", "propertyNames", "dependentSchemas")


def _uncountable_length(schema: Any, path: str) -> str | None:
    """The path of the first `minLength` or `maxLength` past `MAX_LENGTH_COUNT`: the library refused it naming only
    the schema's root (or a forced tool's `tools`), with a regex parse error of its own making ("(?s:.{0,4294967296})
    ... decimal literal invalid"); a generator's "no bound" of 2**63 - 1 among them. Not in `UNENFORCED` keywords'
    subschemas, which no grammar counts."""
    for item, at in schema_objects(schema, path, skip=UNENFORCED):
        for key in ("minLength", "maxLength"):
            value = item.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_LENGTH_COUNT:
                return f"{at}.{key}"
    return None


OUTPUT_DATA = ("enum", "const")  # the data keywords whose values the grammar writes (`default`, `examples`: none)


def _inexact_integer(schema: Any, path: str) -> tuple[str, str] | None:
    """(message, path) of the first integer the library would not write or compare as itself: it reads a number
    as a 64-bit float, so an `enum` or `const` integer no float holds (2**53 + 1) was forced rounded (as
    9007199254740992) and one of 2**63 or more was written as a float's digits (2**63 as 9223372036854776000), while a
    bound no float holds (`minimum` 2**53 + 1) admitted what it excludes (2**53). None when there is none."""
    stack: list[tuple[Any, str, bool]] = [(schema, path, False)]  # (item, path, a value the grammar writes)
    while stack:
        item, at, data = stack.pop()
        if data and isinstance(item, int) and _written(item) != item:
            message = f"the grammar cannot write the integer {item} exactly (it would write {_written(item)})"
            return f"{message}: {_FLOAT_READ}", at
        if isinstance(item, list):
            stack.extend((v, f"{at}[{i}]", data) for i, v in reversed(list(enumerate(item))))
        if not isinstance(item, dict):
            continue
        if not data and (found := _inexact_exclusive(item, at)) is not None:
            return found
        for k, v in reversed(item.items()):
            if data or k in OUTPUT_DATA:
                stack.append((v, f"{at}.{k}", True))
            elif k in NUMBERS and isinstance(v, int) and float(v) != v and not (k == "maximum" and v == INT64_MAX):
                message = f"the grammar cannot bound by {v} exactly (it reads {float(v):.0f}): {_FLOAT_READ}"
                return (
                    f"{message}, so it would admit numbers this bound excludes, or exclude some it admits",
                    f"{at}.{k}",
                )
            elif k in SCHEMA_MAPS and isinstance(v, dict):  # names to schemas (a property may be called "const")
                stack.extend((sub, f"{at}.{k}.{name}", False) for name, sub in reversed(v.items()))
            elif k not in DATA_KEYWORDS:  # a schema, a list of them
                stack.append((v, f"{at}.{k}", False))
    return None


_FLOAT_READ = "the grammar library reads numbers as 64-bit floats, which hold every integer only up to 2**53"


def _is_integer_schema(node: dict[str, Any]) -> bool:
    kinds = node.get("type")
    return kinds == "integer" or (isinstance(kinds, list) and "integer" in kinds)


def _is_bound(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _inexact_exclusive(node: dict[str, Any], path: str) -> tuple[str, str] | None:
    """(message, path) of an integer schema's exclusive bound whose first integer inside no float holds: the library
    computes it as a float, so `{"type": "integer", "exclusiveMinimum": 2**53}` took 2**53 + 1 as 2**53 and admitted
    the bound it excludes (and -2**53 as an exclusiveMaximum likewise). None when there is none."""
    if not _is_integer_schema(node):
        return None
    for key, step in (("exclusiveMinimum", 1), ("exclusiveMaximum", -1)):
        value = node.get(key)
        if not _is_bound(value):
            continue
        edge = math.floor(value) + 1 if step > 0 else math.ceil(value) - 1  # the first integer inside the bound
        if float(edge) != edge:
            message = (
                f"the grammar cannot bound integers by {key} {value} exactly: it takes {edge} as {float(edge):.0f}"
            )
            return f"{message}, so it would admit the bound itself or exclude numbers it admits: {_FLOAT_READ}", (
                f"{path}.{key}"
            )
    return None


def _written(value: int) -> int:
    """The integer the library writes for `value`: its float, and past 2**63 that float's shortest digits."""
    as_float = float(value)
    return int(as_float) if abs(value) < 2**63 else int(Decimal(repr(as_float)))


def _check(node: Any, path: str, root: Any) -> None:
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        raise GrammarError(f"a schema must be an object or a boolean, not {type(node).__name__}", path)
    if "type" in node:
        kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
        for kind in kinds:
            if not isinstance(kind, str) or kind not in TYPES:
                raise GrammarError(f"unknown type {kind!r} (one of {', '.join(sorted(TYPES))})", f"{path}.type")
    for key in SUBSCHEMA:
        if key in node and not (key == "items" and isinstance(node[key], list)):
            _check(node[key], f"{path}.{key}", root)
    if isinstance(node.get("items"), list):
        for i, sub in enumerate(node["items"]):
            _check(sub, f"{path}.items[{i}]", root)
    for key in SCHEMA_MAPS:
        if key in node:
            if not isinstance(node[key], dict):
                raise GrammarError("must be an object mapping names to schemas", f"{path}.{key}")
            for name, sub in node[key].items():
                _check(sub, f"{path}.{key}.{name}", root)
    for key in SCHEMA_LISTS:
        if key in node:
            if not isinstance(node[key], list) or not node[key]:
                raise GrammarError("must be a non-empty array of schemas", f"{path}.{key}")
            for i, sub in enumerate(node[key]):
                _check(sub, f"{path}.{key}[{i}]", root)
    _check_keywords(node, path, root)


def _check_keywords(node: dict[str, Any], path: str, root: Any) -> None:
    if "x-guidance" in node:  # the library reads it: separators that are not JSON's, `lenient` undoing strict
        raise GrammarError("the grammar library's own options cannot be set from a schema", f"{path}.x-guidance")
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise GrammarError("must be an array of property names", f"{path}.required")
    if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
        raise GrammarError("must be a non-empty array", f"{path}.enum")
    if isinstance(node.get("properties"), dict):
        optional = len(node["properties"]) - len(set(required) & node["properties"].keys())
        if optional > MAX_OPTIONAL:
            raise GrammarError(
                f"{optional:,} optional properties in one object; the grammar follows at most about {MAX_OPTIONAL} at "
                "one point (fewer beside additionalProperties or the members of an anyOf): mark some required, or "
                "split the object",
                f"{path}.properties",
            )
    for key in COUNTS:
        value = node.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise GrammarError("must be a non-negative integer", f"{path}.{key}")
    for key in NUMBERS:
        if key in node and (isinstance(node[key], bool) or not isinstance(node[key], (int, float))):
            raise GrammarError("must be a number", f"{path}.{key}")
        if key in node and not (_fits_64_bits(node[key]) or (key == "maximum" and node[key] == INT64_MAX)):
            raise GrammarError("bounds must fit in 64 bits (a magnitude below 2**63)", f"{path}.{key}")
    if "pattern" in node:
        _check_regex(node["pattern"], f"{path}.pattern")
    if isinstance(node.get("patternProperties"), dict):  # its keys are regexes, compiled alike
        for name in node["patternProperties"]:
            check_regex_size(name, f"{path}.patternProperties.{name}")
    if "$ref" in node:
        _check_ref(node["$ref"], f"{path}.$ref", root)


INT64_MAX = (
    2**63 - 1
)  # a maximum int64's largest value (Long.MAX_VALUE, as generated schemas write): its float is 2**63,
# which the library clamps back to this value, so the grammar is exact; other bounds that round to 2**63 are not


def _fits_64_bits(value: float) -> bool:
    """The library reads a bound as a 64-bit float and an integer range in 64 bits: a larger int is refused with an
    unclear message, a range at or past -2**63 crashes the process, one past 2**63 is clamped (a wrong grammar)."""
    if isinstance(value, int) and not -(2**63) < value < 2**63:
        return False  # float() of a huge int overflows
    return -(2.0**63) < float(value) < 2.0**63  # also refuses NaN and the infinities json.loads reads


def _check_regex(pattern: Any, path: str) -> None:
    if not isinstance(pattern, str):
        raise GrammarError("must be a string", path)
    check_regex_size(pattern, path)  # before the library expands it: `^a{1000000}$` took seconds
    try:
        message = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_regex(pattern))
    except ValueError as e:  # text the library cannot take at all, e.g. a lone surrogate (UnicodeEncodeError)
        raise GrammarError(f"invalid regex: {e}", path) from None
    if message and not message.startswith("WARNING"):
        raise GrammarError(f"invalid regex: {message.strip()}", path)


def _check_ref(ref: Any, path: str, root: Any) -> None:
    if not isinstance(ref, str):
        raise GrammarError("must be a string", path)
    if not ref.startswith("#"):
        raise GrammarError(f"only local references ('#/...') are supported, not {ref!r}", path)
    target = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdecimal() and int(part) < len(target):  # not isdigit: '²'
            target = target[int(part)]
        else:
            raise GrammarError(f"reference {ref!r} points nowhere in the schema", path)


def find_key(node: Any, key: str, path: str) -> str | None:
    """The path of the first schema keyword `key` in `node` (depth first), or None. Values of `enum`, `const`,
    `default` and `examples` are data, not schemas, and are not searched."""
    if isinstance(node, dict):
        if key in node:
            return f"{path}.{key}"
        for name, value in node.items():
            if name not in DATA_KEYWORDS:
                found = find_key(value, key, f"{path}.{name}")
                if found:
                    return found
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found = find_key(value, key, f"{path}[{i}]")
            if found:
                return found
    return None
