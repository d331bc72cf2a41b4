"""Tools with Cohere's templates (tests/command_r_templates.py) on the tiny checkpoint: tool_choice "required" and
named run under a grammar of the format's own syntax (Command-R / R+ `Action: ```json [...]``` `, R7B
`<|START_ACTION|>[...]<|END_ACTION|>`), so even random weights give calls that validate (jsonschema), one at most
without parallel_tool_calls; the stream's deltas assemble to the whole result's calls; "auto" beside a JSON schema or a
regex gives a call in the format or an answer in the constraint; an agent loop under either template extends each
prompt and output token for token and hits its whole pages (R7B's through the ids the model emitted, which replace the
template's own text for each reply)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from radixcache.runtime import Engine
from radixcache.runtime.grammar import GrammarSpec
from radixcache.runtime.tools import ToolUse, assemble
from tests.command_r_templates import COMMAND_R, COMMAND_R7B
from tests.runtime.structured.conftest import PAGE, SCHEMAS, TOOL_SCHEMAS, TOOLS, make_engine, response_format

ASK = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 2 + 3?"}]
ONE_CALL: dict[str, Any] = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
SHAPES = {  # the text a forced reply is, around its JSON list of calls
    "command_r": re.compile(r"Action: ```json\n(\[.*\])\n```", re.S),
    "command_r7b": re.compile(r"<\|START_ACTION\|>(\[.*\])<\|END_ACTION\|>", re.S),
}


@pytest.fixture(scope="module", params=["command_r", "command_r7b"])
def engine(request: Any, tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    model = tmp_path_factory.mktemp(request.param) / "tiny"
    shutil.copytree(tiny_dir, model)
    template = COMMAND_R if request.param == "command_r" else COMMAND_R7B
    (model / "chat_template.jinja").write_text(template, encoding="utf-8")  # wins over tokenizer_config's
    with make_engine(model) as e:
        assert e._builder.tool_features.format == request.param
        yield e
        assert e.check()["locked_blocks"] == 0


def _valid(call: Any) -> None:
    jsonschema.validate(json.loads(call.arguments), TOOL_SCHEMAS[call.name])


def _format(engine: Engine) -> str:
    return engine._builder.tool_features.format


def test_required_calls_are_the_formats_syntax_around_calls_that_validate(engine: Engine) -> None:
    for seed in range(4):
        r = engine.chat(ASK, 200, **ONE_CALL, temperature=1.0, seed=seed)
        assert r.finish_reason == "tool_calls" and len(r.tool_calls) == 1 and r.text == "", r
        _valid(r.tool_calls[0])
        raw = engine.tool_memory.lookup(r.tool_calls)
        written = SHAPES[_format(engine)].fullmatch(raw or "")
        assert written is not None, raw
        (item,) = json.loads(written.group(1))  # the list the model wrote, read independently
        assert (item["tool_name"], item["parameters"]) == (r.tool_calls[0].name, json.loads(r.tool_calls[0].arguments))
        assert ("tool_call_id" in item) == (_format(engine) == "command_r7b")


def test_a_named_choice_calls_that_tool_and_parallel_calls_each_validate(engine: Engine) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    for seed in range(2):
        r = engine.chat(ASK, 200, tools=TOOLS, tool_choice=named, temperature=1.2, seed=seed)
        assert [c.name for c in r.tool_calls] == ["add"], r  # a named function: one call, whatever parallel says
        _valid(r.tool_calls[0])
        r = engine.chat(ASK, 300, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed)
        assert r.tool_calls and r.finish_reason in ("tool_calls", "length")
        for call in r.tool_calls if r.finish_reason == "tool_calls" else r.tool_calls[:-1]:
            _valid(call)


def test_stream_deltas_assemble_to_the_whole_results_calls(engine: Engine) -> None:
    async def deltas() -> list[dict[str, Any]]:
        return [d async for d in engine.stream(ASK, 200, **ONE_CALL)]

    content, calls = assemble(asyncio.run(deltas()))
    whole = engine.chat(ASK, 200, **ONE_CALL)
    assert content is None and whole.tool_calls
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        (c.name, c.arguments) for c in whole.tool_calls
    ]


@pytest.mark.parametrize("answer", ["json_schema", "regex"])
def test_auto_beside_a_constraint_calls_in_the_format_or_answers_in_it(engine: Engine, answer: str) -> None:
    kw: dict[str, Any] = (
        {"response_format": response_format("flags")}
        if answer == "json_schema"
        else {"grammar": GrammarSpec.regex(r"(yes|no), [ab]{1,2}")}
    )
    for seed in range(5):
        r = engine.chat(ASK, 200, tools=TOOLS, tool_choice="auto", parallel_tool_calls=False, **kw,
                        temperature=1.0, seed=seed)  # fmt: skip
        if r.finish_reason == "length":
            continue
        if r.tool_calls:
            assert r.finish_reason == "tool_calls" and len(r.tool_calls) == 1
            _valid(r.tool_calls[0])
            assert SHAPES[_format(engine)].fullmatch(engine.tool_memory.lookup(r.tool_calls, r.text) or "")
        elif answer == "json_schema":
            jsonschema.validate(json.loads(r.text), SCHEMAS["flags"])
        else:
            assert re.fullmatch(r"(yes|no), [ab]{1,2}", r.text), r.text


def test_an_agent_loop_extends_each_prompt_token_for_token(engine: Engine) -> None:
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
