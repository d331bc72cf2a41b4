"""JSON schemas the grammar tests decode under: nested objects, arrays, enums, required fields, numbers, strings with
escapes, references."""

from __future__ import annotations

from typing import Any

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "height": {"type": "number"},
        "alive": {"type": "boolean"},
    },
    "required": ["name", "age"],
}

NESTED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "owner": {
            "type": "object",
            "properties": {"login": {"type": "string", "maxLength": 8}, "site": {"type": ["string", "null"]}},
            "required": ["login"],
        },
        "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green", 'say "hi"\\n']}, "maxItems": 3},
    },
    "required": ["id", "owner", "tags"],
}

ENUMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "level": {"enum": [1, 2, 3]},
        "note": {"type": "string", "pattern": "^[a-z]{1,6}$"},
    },
    "required": ["unit", "level", "note"],
}

REFS: dict[str, Any] = {
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}}},
    "type": "object",
    "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1, "maxItems": 2}},
    "required": ["points"],
}

ARRAY_TOP: dict[str, Any] = {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4}

ALL = {"person": PERSON, "nested": NESTED, "enums": ENUMS, "refs": REFS, "array": ARRAY_TOP}
