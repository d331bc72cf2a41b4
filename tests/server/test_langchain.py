"""LangChain's `ChatOpenAI` against `radixcache serve` (the tiny checkpoint: random weights, so only the grammar makes
its output valid): `bind_tools` with pydantic tools and tool_choice "any" or a name gives tool calls whose arguments
the tools' models validate; `with_structured_output` works with every method (function_calling, json_schema: a
validated model; json_mode: a JSON object); streamed calls (with stream usage) assemble to the whole reply's and
report the cache; a plain ReAct-style loop runs three tool steps and a final answer, each
step after the first reporting its previous prompt and output cached in whole pages."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field

langchain_openai = pytest.importorskip("langchain_openai")
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage  # noqa: E402

# Its own server (its module-scoped one, started once under xdist): its lease test holds blocks for 30 s, which
# the shared tiny_tools_server's modules would see as locked.
pytestmark = pytest.mark.xdist_group("langchain")
PAGE = 16  # serve's default --page-size


class Add(BaseModel):
    """Add two small integers."""

    a: int = Field(ge=0, le=99)
    b: int = Field(ge=0, le=99)


class GetWeather(BaseModel):
    """The weather in a city."""

    city: str = Field(max_length=6)
    unit: Literal["c", "f"]


class Verdict(BaseModel):
    """A short verdict."""

    ok: bool
    color: Literal["red", "green", "blue"]
    score: int = Field(ge=0, le=9)


@pytest.fixture(scope="module")
def llm(tiny_model_dir, launch):
    with launch(tiny_model_dir, "--capacity-blocks", "512", "--threads", "1") as server:
        yield langchain_openai.ChatOpenAI(
            base_url=server.v1, api_key="unused", model="tiny", max_tokens=160, max_retries=0, timeout=60
        )


def _ask(tag: str) -> list:
    return [SystemMessage(f"You call tools. ({tag})"), HumanMessage("What is 2 + 3, and how warm is Oslo?")]


@pytest.mark.parametrize("choice", ["any", "Add", "GetWeather"])
def test_bind_tools_gives_calls_the_tools_validate(llm, choice: str) -> None:
    bound = llm.bind_tools([Add, GetWeather], tool_choice=choice, parallel_tool_calls=False)
    for seed in range(2):
        msg = bound.invoke(_ask(f"{choice} {seed}"), seed=seed, temperature=1.0)
        assert len(msg.tool_calls) == 1, msg
        call = msg.tool_calls[0]
        assert choice == "any" or call["name"] == choice
        {"Add": Add, "GetWeather": GetWeather}[call["name"]].model_validate(call["args"])
        assert call["id"].startswith("call_")


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_with_structured_output_gives_a_validated_model(llm, method: str) -> None:
    structured = llm.with_structured_output(Verdict, method=method)
    for seed in range(2):
        out = structured.invoke(_ask(f"verdict {method} {seed}"), seed=seed, temperature=1.0)
        assert isinstance(out, Verdict)


def test_with_structured_output_json_mode_gives_a_json_object(llm) -> None:
    schema = Verdict.model_json_schema()
    structured = llm.with_structured_output(schema, method="json_mode")
    out = structured.invoke([HumanMessage("Answer in JSON.")], seed=1, temperature=1.0)
    assert isinstance(out, dict)


def test_streamed_calls_assemble_to_the_whole_reply_and_report_the_cache(llm) -> None:
    """`.stream()` sends stream=True with stream_options.include_usage (stream_usage): the chunks' tool-call deltas add
    up to the whole reply's call at temperature 0, and the usage chunk says what the cache held (`cache_read`)."""
    bound = llm.model_copy(update={"stream_usage": True}).bind_tools(
        [Add, GetWeather], tool_choice="any", parallel_tool_calls=False
    )
    ask = _ask("stream")
    whole = bound.invoke(ask, temperature=0)
    streamed = None
    for chunk in bound.stream(ask, temperature=0):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None and not streamed.invalid_tool_calls, streamed
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [(c["name"], c["args"]) for c in whole.tool_calls]
    assert streamed.tool_calls[0]["id"].startswith("call_")
    assert streamed.response_metadata["finish_reason"] == "tool_calls"
    usage = streamed.usage_metadata
    prompt = whole.usage_metadata["input_tokens"]
    assert usage["input_tokens"] == prompt and usage["output_tokens"] == whole.usage_metadata["output_tokens"]
    assert usage["input_token_details"]["cache_read"] >= (prompt - 1) // PAGE * PAGE, usage  # the same prompt again


def test_a_react_loop_runs_three_tool_steps_and_each_hits_the_last(llm) -> None:
    tools = {"Add": Add, "GetWeather": GetWeather}
    bound = llm.bind_tools(list(tools.values()), tool_choice="any", parallel_tool_calls=False)
    messages = _ask("react")
    previous = None
    for step in range(3):
        msg = bound.invoke(messages, seed=step, temperature=0.9)
        assert len(msg.tool_calls) == 1, msg
        call = msg.tool_calls[0]
        tools[call["name"]].model_validate(call["args"])
        usage = msg.response_metadata["token_usage"]
        if previous is not None:
            computed = previous["prompt_tokens"] + previous["completion_tokens"]
            assert usage["prompt_tokens_details"]["cached_tokens"] >= (computed - 1) // PAGE * PAGE, (step, usage)
        previous = usage
        messages += [msg, ToolMessage(content=f"result {step}", tool_call_id=call["id"])]
    # The answer, with the tools still bound (they are part of the prompt) but none to call: the whole history hits.
    final = llm.bind_tools(list(tools.values()), tool_choice="none").invoke(messages, max_tokens=8)
    assert not final.tool_calls
    usage = final.response_metadata["token_usage"]
    computed = previous["prompt_tokens"] + previous["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= (computed - 1) // PAGE * PAGE


def test_a_lease_through_extra_body_is_granted(llm) -> None:
    leased = llm.model_copy(update={"extra_body": {"retain_for": 30}})
    usage = leased.invoke([HumanMessage("Keep this context.")], max_tokens=4).response_metadata["token_usage"]
    assert usage["lease"]["seconds"] == 30.0 and usage["lease"]["tokens"] > 0, usage
