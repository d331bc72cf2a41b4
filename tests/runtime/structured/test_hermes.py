"""Tools with a template that renders tools itself and writes calls as `<tool_call>` tags (Hermes, as Qwen2.5 and
Hermes models do): tool_choice "required" and named run under a grammar of tags around one call's JSON, so even the
tiny checkpoint's random weights give calls that validate (jsonschema), each in a tag, one at most without
parallel_tool_calls; the stream's deltas assemble to the whole result's calls; an agent loop replayed as OpenAI
clients send it extends each prompt token for token."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from radixcache.runtime import Engine
from radixcache.runtime.tools import assemble
from tests.runtime.structured.conftest import PAGE, TOOL_SCHEMAS, TOOLS, make_engine
from tests.runtime.tools.test_prefix import HERMES

ASK = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 2 + 3?"}]
ONE_CALL: dict[str, Any] = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}


@pytest.fixture(scope="module")
def engine(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    hermes_dir = tmp_path_factory.mktemp("hermes") / "tiny"
    shutil.copytree(tiny_dir, hermes_dir)
    (hermes_dir / "chat_template.jinja").write_text(HERMES, encoding="utf-8")  # wins over tokenizer_config's
    with make_engine(hermes_dir) as e:
        assert e._builder.tool_features.format == "hermes"
        yield e
        assert e.check()["locked_blocks"] == 0


def _valid(call: Any) -> None:
    jsonschema.validate(json.loads(call.arguments), TOOL_SCHEMAS[call.name])


def test_required_calls_are_tags_around_calls_that_validate(engine: Engine) -> None:
    for seed in range(5):
        r = engine.chat(ASK, 200, **ONE_CALL, temperature=1.0, seed=seed)
        assert r.finish_reason == "tool_calls" and len(r.tool_calls) == 1, r
        _valid(r.tool_calls[0])
        assert r.text == ""
        raw = engine.tool_memory.lookup(r.tool_calls)
        assert raw is not None and raw.startswith("<tool_call>\n") and raw.endswith("\n</tool_call>")


def test_a_named_choice_calls_that_tool(engine: Engine) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    for seed in range(3):
        r = engine.chat(ASK, 200, tools=TOOLS, tool_choice=named, temperature=1.2, seed=seed, parallel_tool_calls=False)
        assert [c.name for c in r.tool_calls] == ["add"]
        _valid(r.tool_calls[0])


def test_parallel_calls_are_tags_one_per_line(engine: Engine) -> None:
    for seed in range(3):
        r = engine.chat(ASK, 300, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed)
        assert r.tool_calls and r.finish_reason in ("tool_calls", "length")
        done = r.tool_calls if r.finish_reason == "tool_calls" else r.tool_calls[:-1]
        for call in done:
            _valid(call)


def test_stream_deltas_assemble_to_the_whole_results_calls(engine: Engine) -> None:
    async def deltas() -> list[dict[str, Any]]:
        return [d async for d in engine.stream(ASK, 200, **ONE_CALL)]

    _, calls = assemble(asyncio.run(deltas()))
    whole = engine.chat(ASK, 200, **ONE_CALL)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        (c.name, c.arguments) for c in whole.tool_calls
    ]


def test_an_agent_loop_extends_each_prompt_token_for_token(engine: Engine) -> None:
    from radixcache.runtime.tools import ToolUse

    messages: list[dict[str, Any]] = [*ASK]
    previous = None
    for step in range(3):
        r = engine.chat(messages, 200, **ONE_CALL, temperature=0.9, seed=step)
        assert r.tool_calls
        prompt = engine.tokenizer.encode(engine._builder.render(messages, ToolUse.of(TOOLS, "required", False)))
        if previous is not None:
            computed = previous[0] + list(previous[1].token_ids)
            assert prompt[: len(computed)] == computed
            assert r.cached_tokens >= (len(computed) - 1) // PAGE * PAGE
        previous = (prompt, r)
        messages.append({"role": "assistant", "content": None, "tool_calls": [c.to_openai() for c in r.tool_calls]})
        messages += [{"role": "tool", "tool_call_id": c.id, "content": f"result {step}"} for c in r.tool_calls]


def test_auto_with_a_json_schema_answers_in_the_schema_or_calls_a_tool(engine: Engine) -> None:
    from tests.runtime.structured.conftest import SCHEMAS, response_format

    for seed in range(6):
        r = engine.chat(ASK, 200, tools=TOOLS, tool_choice="auto", response_format=response_format("flags"),
                        parallel_tool_calls=False, temperature=1.0, seed=seed)  # fmt: skip
        if r.tool_calls:
            assert r.finish_reason == "tool_calls" and len(r.tool_calls) == 1
            _valid(r.tool_calls[0])
        else:
            assert r.finish_reason == "stop", r
            jsonschema.validate(json.loads(r.text), SCHEMAS["flags"])
