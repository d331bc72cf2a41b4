"""A tool's parameters holding NaN or Infinity (Python's json writes and reads them; JSON has neither): the prompt
showed them as written (`"default": NaN`, no JSON) and the grammar read them as null, so `{"const": NaN}` forced the
call `{"x": null}` and `{"enum": ["a", Infinity]}` let null through. They are refused, naming the value's path."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.tools import ToolInputError, normalize_tools

NAN, INF = math.nan, math.inf
CASES = [
    ({"x": {"const": NAN}}, "properties.x.const"),
    ({"x": {"enum": ["a", INF]}}, "properties.x.enum[1]"),
    ({"x": {"type": "number", "default": NAN}}, "properties.x.default"),
    ({"x": {"type": "array", "items": {"examples": [[1, -INF]]}}}, "properties.x.items.examples[0][1]"),
]


def tool(properties: dict[str, Any], name: str = "f") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}


def rfc_json(value: Any) -> bool:
    """The independent check: JSON as RFC 8259 has it, which no NaN or Infinity is."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(("properties", "where"), CASES)
def test_a_tools_nan_or_infinity_is_refused_naming_it(properties: dict[str, Any], where: str) -> None:
    assert not rfc_json(properties)
    with pytest.raises(ToolInputError) as e:
        normalize_tools([tool({"ok": {"type": "string"}}, "g"), tool(properties)])
    assert e.value.path == f"tools[1].function.parameters.{where}"
    assert "NaN and Infinity" in str(e.value)


def test_finite_numbers_and_other_bad_values_keep_their_errors() -> None:
    assert normalize_tools([tool({"x": {"type": "number", "maximum": 1e308, "default": -0.0}})])
    with pytest.raises(ToolInputError, match=r"tools\[0\]\.function\.parameters: is not JSON"):
        normalize_tools([tool({"x": {"enum": [{1, 2}]}})])


def test_the_server_refuses_them_with_a_400_naming_the_value(tmp_path: Path) -> None:
    from tests.cli.conftest import write_tiny_checkpoint

    directory = write_tiny_checkpoint(tmp_path / "tiny")
    engine = Engine(str(directory), capacity_blocks=64, page_size=16, dtype="float64", threads=1)
    try:
        with TestClient(create_app(engine, "tiny")) as client:
            for literal, where in [("NaN", "const"), ("Infinity", "default")]:
                body = {
                    "model": "tiny",
                    "max_tokens": 8,
                    "tool_choice": "required",
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [tool({"x": {where: "LITERAL"}})],
                }
                text = json.dumps(body).replace('"LITERAL"', literal)  # a body Python's json reads
                reply = client.post("/v1/chat/completions", content=text, headers={"content-type": "application/json"})
                assert reply.status_code == 400, reply.text
                assert reply.json()["error"]["param"] == f"tools.0.function.parameters.properties.x.{where}"
    finally:
        engine.close()
