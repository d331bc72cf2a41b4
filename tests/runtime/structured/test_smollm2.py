"""The real model (SmolLM2-135M-Instruct, quant="gguf"), where the point is that a small model under the grammar
emits what the schema says: tool_choice "required" over three tools on varied prompts gives calls that validate
(jsonschema); json_schema outputs validate; streamed and whole replies assemble to the same calls at temperature 0;
an agent loop of three tool steps replayed as OpenAI clients do hits each previous prompt and output's whole
pages; tool_choice "auto" beside a regex or Lark grammar calls a tool for a weather question and answers a yes/no
question in the grammar."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import jsonschema
import pytest

from radixcache.runtime import Engine
from radixcache.runtime.grammar import GrammarSpec
from radixcache.runtime.testing import hold_engine_loop
from radixcache.runtime.tools import assemble
from tests.smollm2_tools import TOOLS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("structured_smollm2")]
PAGE = 16

# One call per reply: with parallel_tool_calls true SmolLM2 at temperature 0 often repeats its call until the length
# limit (the grammar lets it: the list of calls is open), the last call then cut short.
ONE: dict[str, Any] = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
PROMPTS = [
    "What's the weather like in Paris?",
    "Add 17 and 25.",
    "Find recent news about electric cars.",
    "Is it cold in Oslo today? Use Fahrenheit.",
    "What is 1234 plus 4321?",
    "Look up the tallest mountain in Africa.",
    "Weather in Tokyo please.",
    "Sum 3 and 4, then tell me.",
]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "skills": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "skills"],
}


@pytest.fixture(scope="module")
def engine(smollm2_gguf: Any, smollm2_gguf_model: Any) -> Any:
    # quant="gguf" (tests/conftest.py, the model built once per worker): what is asserted is the grammar's and the
    # cache's doing, on either weight path
    with Engine(smollm2_gguf_model, tokenizer=smollm2_gguf.tokenizer, page_size=PAGE) as e:
        yield e


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_required_calls_on_varied_prompts_validate(engine: Engine) -> None:
    handles = [engine.submit(engine._builder.render(user(p), _use()), 160, **ONE) for p in PROMPTS]
    for h in handles:
        r = h.result(600)
        assert r.finish_reason == "tool_calls" and r.tool_calls, r.text
        for call in r.tool_calls:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def _use() -> Any:
    from radixcache.runtime.tools import ToolUse

    return ToolUse.of(TOOLS, "required", False)


def test_json_schema_outputs_validate(engine: Engine) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    asks = ["Describe a famous chemist.", "Invent a pirate.", "A software engineer from Lagos.", "Describe yourself."]
    release = hold_engine_loop(engine)  # queued together: one batch of four, the same batch on every run
    try:
        handles = [
            engine.submit(
                engine._builder.render(user(ask)), 160, response_format=rf, temperature=0.7 if i % 2 else 0.0, seed=i
            )
            for i, ask in enumerate(asks)
        ]
    finally:
        release()
    for h in handles:
        r = h.result(600)
        assert r.finish_reason == "stop", r.text
        jsonschema.validate(json.loads(r.text), PERSON)


def test_streamed_and_whole_replies_give_the_same_calls(engine: Engine) -> None:
    kw = ONE

    async def deltas() -> list[dict[str, Any]]:
        return [d async for d in engine.stream(user(PROMPTS[0]), 160, **kw)]

    _, calls = assemble(asyncio.run(deltas()))
    whole = engine.chat(user(PROMPTS[0]), 160, **kw)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        (c.name, c.arguments) for c in whole.tool_calls
    ]


def test_an_agent_loop_hits_each_previous_prompt_and_output(engine: Engine) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "developer", "content": "You are an agent. Call tools."},
        *user("Weather in Paris, then add 2 and 3, then search for Paris museums."),
    ]
    previous, previous_prompt = None, []
    for step in range(3):
        r = engine.chat(messages, 160, **ONE)
        assert r.tool_calls, r.text
        prompt = engine.tokenizer.encode(engine._builder.render(messages, _use()))
        if previous is not None:
            # token for token: SmolLM2 under the grammar often emits a split the tokenizer would not make (`"` then
            # `}}`), and the next prompt must carry those very ids (runtime.tools.known_tokens)
            computed = previous_prompt + list(previous.token_ids)
            assert prompt[: len(computed)] == computed, step
            assert r.cached_tokens >= (len(computed) - 1) // PAGE * PAGE, (step, r.cached_tokens, len(computed))
        previous, previous_prompt = r, prompt
        messages.append({"role": "assistant", "content": None, "tool_calls": [c.to_openai() for c in r.tool_calls]})
        messages += [{"role": "tool", "tool_call_id": c.id, "content": f"ok {step}"} for c in r.tool_calls]
    final = engine.chat(messages, 16, tools=TOOLS)
    assert final.cached_tokens >= (previous.prompt_tokens + len(previous.token_ids) - 1) // PAGE * PAGE


ANSWER = r"(yes|no)\. [A-Z][a-z ]{0,40}\."
YES_NO = ["Is Paris in France? Answer yes or no.", "Is the sun cold? Answer yes or no."]


@pytest.mark.parametrize(
    "constraint",
    [{"grammar": GrammarSpec.regex(ANSWER)}, {"grammar": GrammarSpec.ebnf(f"start: /{ANSWER}/", path="grammar")}],
    ids=["regex", "lark"],
)
def test_auto_beside_a_grammar_calls_a_tool_or_answers_in_the_grammar(engine: Engine, constraint: Any) -> None:
    """tool_choice "auto" with a regex or grammar: the regex ran alone, so SmolLM2 could never call a tool. Now a
    weather question gets a call that validates and a yes/no question an answer the regex matches whole."""
    kinds = []
    chats = [user(prompt) for prompt in [*PROMPTS[:2], *YES_NO]]  # one batch (queued together)
    for r in engine.chat(chats, 80, tools=TOOLS, tool_choice="auto", parallel_tool_calls=False, **constraint):
        if r.tool_calls:
            assert r.finish_reason == "tool_calls", r
            jsonschema.validate(json.loads(r.tool_calls[0].arguments), SCHEMAS[r.tool_calls[0].name])
        else:
            assert r.finish_reason == "stop" and re.fullmatch(ANSWER, r.text), r
        kinds.append("call" if r.tool_calls else "answer")
    assert "call" in kinds and "answer" in kinds, kinds
