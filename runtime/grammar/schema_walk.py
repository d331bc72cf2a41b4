"""Every schema object inside a JSON schema, with its path, in schema order: the walk the checks that look for one
keyword anywhere share (runtime.grammar.one_sided's bounds, schema_check's string lengths).

Keywords whose values are data (`DATA_KEYWORDS`) are not searched; under the keywords of `SCHEMA_MAPS` each value is
a schema by name (a property may be called "enum" or "minimum"); anything else (lists, `items`, `anyOf` members,
unknown keywords) is searched whole. Iterative: a schema nested thousands deep raises nothing here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")  # names to schemas
DATA_KEYWORDS = ("enum", "const", "default", "examples")  # their values are data, not schemas


def schema_objects(schema: Any, path: str, skip: tuple[str, ...] = ()) -> Iterator[tuple[dict[str, Any], str]]:
    """(object, its path) for every dict in `schema` reached through schema keywords, parents before children and
    siblings in their order; the subschemas under the keywords in `skip` are left out."""
    stack = [(schema, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, list):
            stack.extend((v, f"{at}[{i}]") for i, v in reversed(list(enumerate(item))))
        if not isinstance(item, dict):
            continue
        yield item, at
        for key, value in reversed(item.items()):
            if key in DATA_KEYWORDS or key in skip:
                continue
            if key in SCHEMA_MAPS and isinstance(value, dict):
                stack.extend((sub, f"{at}.{key}.{name}") for name, sub in reversed(value.items()))
            else:
                stack.append((value, f"{at}.{key}"))
