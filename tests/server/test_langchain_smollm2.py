"""LangChain's `ChatOpenAI` against `radixcache serve` on SmolLM2-135M-Instruct (slow: the lead runs it), the real
model the tiny checkpoint's tests (test_langchain.py) stand in for: `bind_tools` with pydantic tools on varied
prompts gives one call each whose arguments the tool's model validates (tool_choice "any" and a named tool);
`with_structured_output` works with every method (function_calling and json_schema: a validated model; json_mode:
a JSON object, parsed without error) and streamed calls assemble to the whole reply's at temperature 0 (these two in
the extended tier, RADIXCACHE_EXTENDED=1: the default run holds them more cheaply); a ReAct-style
loop runs three tool steps (the tools really run) and an answer, each step after the first reporting its previous
prompt and output cached in whole pages."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

langchain_openai = pytest.importorskip("langchain_openai")
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smollm2_server")]  # the shared server (conftest.py)
PAGE = 16  # serve's default --page-size
CONCURRENT = {"max_concurrency": 8}  # batch(): every input in flight at once (decoded together)


class GetWeather(BaseModel):
    """The current weather in a city."""

    city: str = Field(max_length=40)
    unit: Literal["celsius", "fahrenheit"] = "celsius"


class Add(BaseModel):
    """Add two integers."""

    a: int
    b: int


class Search(BaseModel):
    """Search the web."""

    query: str = Field(max_length=60)


class Person(BaseModel):
    """A person described in the text."""

    name: str = Field(max_length=30)
    age: int = Field(ge=0, le=120)
    city: str = Field(max_length=30)


TOOLS: dict[str, type[BaseModel]] = {"GetWeather": GetWeather, "Add": Add, "Search": Search}
PROMPTS = [
    "What's the weather like in Oslo?",
    "Add 17 and 25.",
    "Search the web for jazz history.",
    "Is it cold in Seoul today? Answer in fahrenheit.",
    "What is 314 plus 159?",
    "Find me articles about solar eclipses.",
]
PEOPLE = ["Aiko, 34, a painter from Kyoto.", "A pilot, Ines (29), Lisbon."]


def run(call: dict[str, Any]) -> str:
    """The tools, run for real on the model's arguments."""
    args = TOOLS[call["name"]].model_validate(call["args"])
    if isinstance(args, Add):
        return str(args.a + args.b)
    if isinstance(args, GetWeather):
        return f"{args.city}: 14 degrees {args.unit}, light rain"
    return f"3 results for {args.query!r}"


@pytest.fixture(scope="module")
def llm(smollm2_server):
    return langchain_openai.ChatOpenAI(
        base_url=smollm2_server.v1, api_key="unused", model="smollm2", max_tokens=160, temperature=0, max_retries=0,
        timeout=600,
    )  # fmt: skip


def test_bind_tools_on_varied_prompts_gives_calls_the_tools_validate(llm) -> None:
    def ask(choice: str, prompt: str) -> Any:
        bound = llm.bind_tools(list(TOOLS.values()), tool_choice=choice, parallel_tool_calls=False)
        return bound.invoke([HumanMessage(prompt)])

    # A named tool is called even against the prompt. All eight are in flight at once, so the server decodes them
    # together (one at a time, each decode step reads all the weights for one token); each reply is checked alone.
    choices = ["any"] * len(PROMPTS) + ["Search", "Add"]
    with ThreadPoolExecutor(len(choices)) as pool:
        replies = list(pool.map(ask, choices, [*PROMPTS, PROMPTS[0], PROMPTS[2]]))
    names = set()
    for prompt, msg in zip(PROMPTS, replies, strict=False):
        assert len(msg.tool_calls) == 1 and not msg.invalid_tool_calls, (prompt, msg)
        call = msg.tool_calls[0]
        TOOLS[call["name"]].model_validate(call["args"])
        names.add(call["name"])
    assert len(names) >= 2, names  # the model chooses among the tools, not one tool for everything
    for name, msg in zip(choices[len(PROMPTS) :], replies[len(PROMPTS) :], strict=True):
        assert [c["name"] for c in msg.tool_calls] == [name], msg.tool_calls
        TOOLS[name].model_validate(msg.tool_calls[0]["args"])


# Extended tier (tests/conftest.py), these three and the streamed calls below: the default run holds each property
# more cheaply. LangChain's side (the same calls through langchain_openai: with_structured_output by every method,
# streamed calls that assemble to the whole reply) is test_langchain.py's on the tiny checkpoint, whose replies the
# same grammars bind; SmolLM2's side (its grammar-bound replies validate, streamed and whole calls agree at
# temperature 0 over HTTP) is test_tools_smollm2.py's test_json_schema_replies_validate and
# test_streamed_and_whole_replies_assemble_to_the_same_calls_at_temperature_0. About 6 s of the last full run.
@pytest.mark.extended
@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_with_structured_output_gives_a_validated_model(llm, method: str) -> None:
    structured = llm.with_structured_output(Person, method=method, include_raw=True)
    for out in structured.batch([[SystemMessage("Extract the person."), HumanMessage(t)] for t in PEOPLE], CONCURRENT):
        assert out["parsing_error"] is None and isinstance(out["parsed"], Person), out


@pytest.mark.extended  # see test_with_structured_output_gives_a_validated_model
def test_with_structured_output_json_mode_gives_a_json_object(llm) -> None:
    structured = llm.with_structured_output(None, method="json_mode", include_raw=True)
    system = SystemMessage("Reply with a JSON object with the keys name, age and city.")
    for out in structured.batch([[system, HumanMessage(text)] for text in PEOPLE], CONCURRENT):
        assert out["parsing_error"] is None and isinstance(out["parsed"], dict), out


@pytest.mark.extended  # see test_with_structured_output_gives_a_validated_model
def test_streamed_calls_assemble_to_the_whole_reply_at_temperature_0(llm) -> None:
    bound = llm.model_copy(update={"stream_usage": True}).bind_tools(
        list(TOOLS.values()), tool_choice="any", parallel_tool_calls=False
    )

    def assembled(prompt: str) -> Any:
        streamed = None
        for chunk in bound.stream([HumanMessage(prompt)]):
            streamed = chunk if streamed is None else streamed + chunk
        return streamed

    for prompt in PROMPTS[:2]:  # whole and streamed at once: they decode side by side in the same steps
        with ThreadPoolExecutor(2) as pool:
            whole_future = pool.submit(bound.invoke, [HumanMessage(prompt)])
            streamed = pool.submit(assembled, prompt).result()
            whole = whole_future.result()
        assert streamed is not None and not streamed.invalid_tool_calls, streamed
        assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [
            (c["name"], c["args"]) for c in whole.tool_calls
        ]
        assert streamed.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]


def test_a_react_loop_runs_three_tool_steps_and_each_hits_the_last(llm) -> None:
    bound = llm.bind_tools(list(TOOLS.values()), tool_choice="any", parallel_tool_calls=False)
    messages: list[Any] = [
        SystemMessage("You are an agent. Call tools, one at a time, then answer."),
        HumanMessage("Weather in Paris, then add 2 and 3, then search for Paris museums."),
    ]
    previous = None
    for step in range(3):
        msg = bound.invoke(messages)
        assert len(msg.tool_calls) == 1 and not msg.invalid_tool_calls, (step, msg)
        usage = msg.response_metadata["token_usage"]
        if previous is not None:
            computed = previous["prompt_tokens"] + previous["completion_tokens"]
            assert usage["prompt_tokens_details"]["cached_tokens"] >= (computed - 1) // PAGE * PAGE, (step, usage)
        previous = usage
        messages += [msg, ToolMessage(run(msg.tool_calls[0]), tool_call_id=msg.tool_calls[0]["id"])]
    final = llm.bind_tools(list(TOOLS.values()), tool_choice="none").invoke(messages, max_tokens=16)
    assert not final.tool_calls and final.response_metadata["finish_reason"] in ("stop", "length")
    usage = final.response_metadata["token_usage"]
    computed = previous["prompt_tokens"] + previous["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= (computed - 1) // PAGE * PAGE, usage
