"""Hostile tool and structured-output bodies over HTTP (hypothesis), on the tiny checkpoint: schemas, tools,
tool_choice, parallel_tool_calls, the legacy functions / function_call, response_format, regex, grammar and agent
histories drawn from near-valid shapes and junk, whole and streamed. Each is answered 200 (and then runs to its
end: a stream ends with `[DONE]` and no error event) or 400 with OpenAI's error body, never a 5xx; afterwards a
greedy bystander's reply equals its reply before, and no page is left locked."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tiny_tools import TOOLS

pytestmark = pytest.mark.xdist_group("tiny_tools_server")  # the shared server (conftest.py)

NAMES = st.sampled_from(["add", "get_weather", "now", "f", "", "has space", "x" * 65, "ünï"])
JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-1e3, 1e3, allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
KEYWORDS = [
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$defs",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "additionalProperties",
    "format",
    "not",
    "minItems",
    "maxItems",
    "uniqueItems",
    "prefixItems",
]
TYPES = st.sampled_from(["object", "string", "integer", "number", "boolean", "null", "array", "strin", 5])


def _schema(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    values = {
        "type": TYPES | st.lists(TYPES, max_size=2),
        "properties": st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
        "required": st.lists(st.sampled_from(["a", "b", "z"]), max_size=2) | JUNK,
        "items": inner,
        "enum": st.lists(st.integers(0, 3) | st.sampled_from(["x", "y"]), max_size=3) | JUNK,
        "const": JUNK,
        "anyOf": st.lists(inner, max_size=2),
        "oneOf": st.lists(inner, max_size=2),
        "allOf": st.lists(inner, max_size=2),
        "$ref": st.sampled_from(["#", "#/$defs/a", "#/nope", "http://x", 3]),
        "$defs": st.dictionaries(st.sampled_from(["a"]), inner, max_size=1),
        "pattern": st.sampled_from(["[a-c]{1,2}", "((", "(?=a)", "\\d+", 7]),
        "minLength": st.integers(-1, 3) | JUNK,
        "maxLength": st.integers(-1, 4),
        "minimum": st.integers(-3, 3) | JUNK,
        "maximum": st.integers(-3, 9),
        "additionalProperties": st.booleans() | inner,
        "format": st.sampled_from(["date", "email", "uuid", "nope"]),
        "not": inner,
        "minItems": st.integers(-1, 2),
        "maxItems": st.integers(0, 2),
        "uniqueItems": st.booleans(),
        "prefixItems": st.lists(inner, max_size=2),
    }
    return st.fixed_dictionaries({}, optional={k: values[k] for k in KEYWORDS}) | JUNK


SCHEMA = st.recursive(st.fixed_dictionaries({"type": TYPES}) | st.booleans(), _schema, max_leaves=5)
TOOL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "function", "retrieval"])},
    optional={
        "function": st.fixed_dictionaries(
            {"name": NAMES},
            optional={"description": st.text(max_size=8) | JUNK, "parameters": SCHEMA, "strict": st.booleans() | JUNK},
        )
        | JUNK
    },
)
CHOICE = st.sampled_from([None, "auto", "none", "required", "sometimes"]) | st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "tool"]), "function": st.fixed_dictionaries({"name": NAMES}) | JUNK}
)
RESPONSE_FORMAT = (
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])},
        optional={
            "json_schema": st.fixed_dictionaries(
                {"name": st.text(max_size=5)}, optional={"schema": SCHEMA, "strict": JUNK}
            )
            | JUNK
        },
    )
    | JUNK
)
CALL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "other"])},
    optional={
        "id": st.sampled_from(["call_1", "", None, 5]),
        "function": st.fixed_dictionaries(
            {"name": NAMES}, optional={"arguments": st.sampled_from(['{"a": 1}', "{bad", "[]", "{}"]) | JUNK}
        )
        | JUNK,
    },
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"])},
    optional={
        "function_call": st.fixed_dictionaries({"name": NAMES}, optional={"arguments": st.sampled_from(["{}", "{x"])})
        | JUNK,
        "content": st.none()
        | st.text(max_size=10)
        | st.lists(
            st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=5)}),
            max_size=2,
        )
        | JUNK,
        "name": st.text(max_size=5) | JUNK,
        "tool_calls": st.lists(CALL, max_size=2) | JUNK,
        "tool_call_id": st.sampled_from(["call_1", ""]) | JUNK,
    },
)
BODY = st.fixed_dictionaries(
    {"stream": st.booleans()},
    optional={
        "tools": st.just(TOOLS) | st.lists(TOOL, max_size=3) | JUNK,
        "tool_choice": CHOICE | JUNK,
        "functions": st.lists(TOOL.map(lambda t: t.get("function", t)), max_size=2) | JUNK,
        "function_call": st.sampled_from(["none", "auto", "required"]) | st.fixed_dictionaries({"name": NAMES}) | JUNK,
        "parallel_tool_calls": st.booleans() | JUNK,
        "response_format": RESPONSE_FORMAT,
        "regex": st.sampled_from(["[a-c]{1,3}", "((", "a|b", "(?=a)b", "x*"]) | JUNK,
        "grammar": st.sampled_from(['root ::= "a" | "b"', "root ::= missing", 'start: "x"', "", "::="]) | JUNK,
        "messages": st.just([{"role": "user", "content": "hi"}]) | st.lists(MESSAGE, min_size=1, max_size=3),
        "stream_options": st.just({"include_usage": True}),
    },
)
BYSTANDER = {"model": "tiny", "messages": [{"role": "user", "content": "bystander"}], "max_tokens": 8, "temperature": 0}


def _post(tiny_tools_server, body: dict[str, Any]) -> tuple[int, str]:
    with httpx.stream("POST", tiny_tools_server.v1 + "/chat/completions", json=body, timeout=60) as r:
        return r.status_code, r.read().decode()


@pytest.fixture(scope="module")
def bystander(tiny_tools_server) -> str:
    status, text = _post(tiny_tools_server, BYSTANDER)
    assert status == 200, text
    return json.loads(text)["choices"][0]["message"]["content"]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(body=BODY)
def test_hostile_tool_bodies_are_200_or_400_never_5xx(tiny_tools_server, bystander, body: dict[str, Any]) -> None:
    full = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, **body}
    status, text = _post(tiny_tools_server, full)
    assert status in (200, 400), (status, text, full)
    if status == 400:
        error = json.loads(text)["error"]
        assert error["type"] == "invalid_request_error" and error["message"], error
    elif body["stream"]:
        assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text, text
    else:
        assert json.loads(text)["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


def test_the_server_is_whole_after_the_fuzz(tiny_tools_server, bystander) -> None:
    status, text = _post(tiny_tools_server, BYSTANDER)
    assert status == 200 and json.loads(text)["choices"][0]["message"]["content"] == bystander
    assert tiny_tools_server.locked_blocks_settled() == 0
