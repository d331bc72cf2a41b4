"""Fixtures for structured output and tools in the engine: the tiny checkpoint (its real byte-level tokenizer and
ChatML template, random weights) in float64, so that batched and lone runs give equal tokens, and schemas whose
every sentence is short (bounded integers, enums, strings with maxLength, arrays with maxItems), so a random model
under the grammar always ends. The tools are `strict` (OpenAI's per-tool flag): without it an object admits any
other key, and a random model writes keys without end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime import Engine

PAGE = 16

SCHEMAS: dict[str, dict[str, Any]] = {
    "flags": {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": -5, "maximum": 120},
            "color": {"enum": ["red", "green", "blue"]},
        },
        "required": ["ok", "n", "color"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 5},
                    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
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

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}},
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
                    "a": {"type": "integer", "minimum": 0, "maximum": 99},
                    "b": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["a", "b"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "description": "The time.", "strict": True}},
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in TOOLS}


def response_format(name: str) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def parsed(text: str) -> Any:
    return json.loads(text)


def make_engine(model: Path, **kw: Any) -> Engine:
    options: dict[str, Any] = {"capacity_blocks": 256, "page_size": PAGE, "dtype": "float64", "threads": 1}
    options.update(kw)
    return Engine(str(model), **options)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.cli.conftest import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("structured") / "tiny")


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Iterator[Engine]:
    with make_engine(tiny_dir) as e:
        yield e
        assert e.check()["locked_blocks"] == 0
