"""Tools, schemas and checks shared by the tool and structured-output tests on the tiny checkpoint, in the engine
(tests/runtime/structured) and over HTTP (tests/server).

The tiny model writes random tokens (about one character each), so every schema here is short to finish: bounded
integers, enums, strings with maxLength; tools are `strict`, so an arguments object admits no other key. Whatever
the model writes, the grammar makes it valid: validating it (jsonschema) is the test."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 4}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two small integers.",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": 0, "maximum": 9},
                    "b": {"type": "integer", "minimum": 0, "maximum": 9},
                },
                "required": ["a", "b"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "description": "The time.", "strict": True}},
]
TOOL_SCHEMAS = {
    t["function"]["name"]: t["function"].get("parameters", {"type": "object", "properties": {}}) for t in TOOLS
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "flags": {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": -5, "maximum": 99},
            "color": {"enum": ["red", "blue"]},
        },
        "required": ["ok", "n", "color"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 3},
                    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
                },
                "required": ["name", "tags"],
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
    },
    "choice": {
        "anyOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "x"}, "v": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["kind", "v"],
            },
            {
                "type": "object",
                "properties": {"kind": {"const": "y"}, "w": {"type": "boolean"}},
                "required": ["kind", "w"],
            },
        ]
    },
}


def closed(schema: Any) -> Any:
    """`schema` with every object that lists `properties` closed to other keys, as strict output is."""
    if isinstance(schema, dict):
        out = {k: closed(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


def response_format(name: str, strict: bool = True) -> dict[str, Any]:
    """OpenAI's json_schema response_format of SCHEMAS[name]; objects closed to other keys (strict)."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": strict}}


def check_calls(calls: list[Any] | None, names: set[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """Each call of an OpenAI reply (SDK objects or dicts) has an id, names a given tool and has arguments that
    parse and validate against that tool's schema; returns (name, arguments) of each."""
    assert calls, "the reply has no tool calls"
    out = []
    for call in calls:
        call = call if isinstance(call, dict) else call.model_dump()
        assert call["type"] == "function" and call["id"].startswith("call_")
        name = call["function"]["name"]
        assert name in (names or TOOL_SCHEMAS), name
        arguments = json.loads(call["function"]["arguments"])
        jsonschema.validate(arguments, closed(TOOL_SCHEMAS[name]))
        out.append((name, arguments))
    return out
