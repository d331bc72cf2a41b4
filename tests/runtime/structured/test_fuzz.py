"""Hostile structured-output and tool fields through the engine, drawn by hypothesis while a greedy bystander
decodes: response_format bodies, grammars, tools, tool_choice and parallel_tool_calls of any shape. Each call is
refused at once with a ValueError (GrammarError, ToolInputError) or TypeError, or runs to an end; never another
exception. The bystander always equals its output alone, and afterwards no block is held."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime import Engine
from tests.runtime.structured.conftest import SCHEMAS, TOOLS

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=6))
JSON = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["type", "properties", "required", "enum", "items", "pattern", "$ref", "anyOf", "x"]),
            inner,
            max_size=3,
        ),
    ),
    max_leaves=8,
)
SCHEMA = st.one_of(st.sampled_from(list(SCHEMAS.values())), JSON)
RESPONSE_FORMAT = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries({"name": st.just("x"), "schema": SCHEMA})}
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "yaml", "json_schema", None])}),
    JSON,
)
TOOL = st.one_of(
    st.sampled_from(TOOLS),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["function", "retrieval"]),
            "function": st.fixed_dictionaries(
                {"name": st.text(max_size=5), "parameters": st.one_of(SCHEMA, st.none()), "strict": JSON_LEAF}
            ),
        }
    ),
    JSON,
)
CHOICE = st.one_of(
    st.sampled_from(["auto", "none", "required", "any", None]),
    st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.text(max_size=4)})}
    ),
    JSON,
)


@settings(max_examples=40, deadline=None)
@given(
    response_format=st.one_of(st.none(), RESPONSE_FORMAT),
    tools=st.one_of(st.none(), st.lists(TOOL, max_size=3), JSON),
    tool_choice=CHOICE,
    parallel=st.one_of(st.none(), st.booleans(), JSON_LEAF),
)
def test_hostile_fields_are_refused_or_run_and_never_touch_a_bystander(
    engine: Engine, response_format: Any, tools: Any, tool_choice: Any, parallel: Any
) -> None:
    bystander = engine.submit("bystander", 16, ignore_eos=True)
    kw: dict[str, Any] = {"response_format": response_format, "tool_choice": tool_choice}
    if tools is not None:
        kw["tools"] = tools
    if parallel is not None:
        kw["parallel_tool_calls"] = parallel
    try:
        r = engine.chat([{"role": "user", "content": "hi"}], 24, **kw)
    except (ValueError, TypeError) as exc:
        assert str(exc)
    else:
        assert r.finish_reason in ("stop", "length", "tool_calls")
    assert bystander.result(60).token_ids == alone(engine)


_ALONE: list[tuple[int, ...]] = []


def alone(engine: Engine) -> tuple[int, ...]:
    if not _ALONE:
        _ALONE.append(engine.generate("bystander", 16, ignore_eos=True).token_ids)
    return _ALONE[0]
