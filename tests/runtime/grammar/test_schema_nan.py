"""A schema holding NaN or Infinity (Python's json reads both; JSON has neither): the grammar library read them as
null, so `{"const": NaN}` made the answer `{"x": null}` with a 200. They are refused wherever a schema comes in
(`GrammarSpec.json_schema` from a dict or text, `response_format` on the Python API and the server), naming the
value's path, with the same check tools' parameters use."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.grammar import GrammarError, GrammarSpec
from radixcache.runtime.server import create_app

NAN, INF = math.nan, math.inf
CASES = [
    ({"properties": {"x": {"const": NAN}}, "required": ["x"]}, "properties.x.const"),
    ({"properties": {"x": {"enum": ["a", INF]}}}, "properties.x.enum[1]"),
    ({"properties": {"x": {"type": "number", "maximum": -INF}}}, "properties.x.maximum"),
    ({"properties": {"x": {"type": "array", "items": {"default": [1, NAN]}}}}, "properties.x.items.default[1]"),
]


def schema(body: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", **body}


@pytest.mark.parametrize(("body", "where"), CASES)
def test_a_schemas_nan_or_infinity_is_refused_naming_it(body: dict[str, Any], where: str) -> None:
    path = "response_format.json_schema.schema"
    with pytest.raises(ValueError, match="Out of range float"):
        json.dumps(schema(body), allow_nan=False)  # the independent check: not JSON
    for given in (schema(body), json.dumps(schema(body))):  # a dict, or text Python's json reads
        with pytest.raises(GrammarError) as e:
            GrammarSpec.json_schema(given)
        assert (e.value.path, "NaN and Infinity" in str(e.value)) == (f"{path}.{where}", True)
    with pytest.raises(GrammarError) as e:
        GrammarSpec.from_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema(body)}})
    assert e.value.path == f"{path}.{where}"


def test_finite_numbers_still_make_a_spec() -> None:
    spec = GrammarSpec.json_schema({"type": "number", "maximum": 1e15, "default": 1e300})
    assert json.loads(spec.source)["default"] == 1e300


def test_the_server_refuses_them_with_a_400_naming_the_value(tmp_path: Path) -> None:
    from tests.cli.conftest import write_tiny_checkpoint

    directory = write_tiny_checkpoint(tmp_path / "tiny")
    engine = Engine(str(directory), capacity_blocks=64, page_size=16, dtype="float64", threads=1)
    try:
        with TestClient(create_app(engine, "tiny")) as client:
            for literal in ("NaN", "-Infinity"):
                body = {
                    "model": "tiny",
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "hi"}],
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "x", "schema": schema(CASES[0][0])},
                    },
                }
                text = json.dumps(body, allow_nan=True).replace("NaN", literal)  # a body Python's json reads
                reply = client.post("/v1/chat/completions", content=text, headers={"content-type": "application/json"})
                assert reply.status_code == 400, reply.text
                assert reply.json()["error"]["param"] == "response_format.json_schema.schema.properties.x.const"
    finally:
        engine.close()
