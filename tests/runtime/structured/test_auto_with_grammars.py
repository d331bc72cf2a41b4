"""tool_choice "auto" beside a regex or an EBNF grammar (GBNF or Lark), in the Python API (tiny checkpoint): the model
may call a tool, and an answer in text matches the constraint, as OpenAI has it for response_format. The regex or
grammar used to run alone, so no call could ever be written, and nothing said so.

The grammar a request runs under is checked against independent texts (a call, an answer, neither) token by token;
runs at temperature 1 give either calls that validate or text the constraint matches whole."""

from __future__ import annotations

import re
from typing import Any

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.engine.tool_calls import request_grammar
from radixcache.runtime.grammar import GrammarError, GrammarSpec, GrammarState
from radixcache.runtime.tools import TemplateFeatures, ToolUse
from tests.runtime.structured.conftest import TOOLS
from tests.runtime.structured.test_tools import ASK, check_calls

HERMES = TemplateFeatures(uses_tools=True, tool_role=True, hermes=True)
ANSWERS = {  # each spec, and its whole language (small, so a sample is checked against all of it)
    "regex": (GrammarSpec.regex(r"(yes|no), [ab]{1,2}"), r"(yes|no), [ab]{1,2}"),
    "gbnf": (GrammarSpec.ebnf('root ::= ("yes" | "no") ", " [ab] [ab]?', path="grammar"), r"(yes|no), [ab]{1,2}"),
    "lark": (
        GrammarSpec.ebnf('start: WORD ", " /[ab]{1,2}/\nWORD: "yes" | "no"', path="grammar"),
        r"(yes|no), [ab]{1,2}",
    ),
}
CALL = '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}'
HERMES_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def accepts(engine: Engine, spec: GrammarSpec, text: str) -> bool:
    """Whether `text` (canonically encoded) is a whole sentence of `spec`."""
    state = GrammarState(engine._builder.grammars.compiler.compile(spec))
    for token in engine.tokenizer.encode(text, add_special_tokens=False):
        if not state.matcher.consume_token(token):
            return False
    return state.is_complete()


def auto(answer: GrammarSpec, parallel: bool = True) -> RequestOptions:
    return RequestOptions(grammar=answer, tool_use=ToolUse.of(TOOLS, "auto", parallel))


@pytest.mark.parametrize("kind", list(ANSWERS))
@pytest.mark.parametrize("features", [TemplateFeatures(), HERMES], ids=["generic", "hermes"])
def test_auto_beside_a_grammar_admits_a_call_or_an_answer_and_nothing_else(
    engine: Engine, kind: str, features: TemplateFeatures
) -> None:
    answer, _ = ANSWERS[kind]
    spec = request_grammar(auto(answer), features)
    assert spec is not None
    call = HERMES_CALL if features.format == "hermes" else CALL
    assert accepts(engine, spec, call)
    assert accepts(engine, spec, "no, ab") and accepts(engine, spec, "yes, b")
    for neither in ("maybe", "no, abc", "yes", '{"tool_calls": [{"name": "sub", "arguments": {}}]}'):
        assert not accepts(engine, spec, neither), neither
    one = request_grammar(auto(answer, parallel=False), features)
    two = f"{call}\n{call}" if features.format == "hermes" else CALL.replace("}]}", "}, " + CALL[16:-2] + "]}")
    assert accepts(engine, request_grammar(auto(answer), features), two)
    assert one is not None and not accepts(engine, one, two)  # parallel_tool_calls false: one call at most


@pytest.mark.parametrize("kind", list(ANSWERS))
def test_auto_beside_a_grammar_gives_valid_calls_or_a_matching_answer(engine: Engine, kind: str) -> None:
    answer, language = ANSWERS[kind]
    seen = set()
    for seed in range(6):
        r = engine.chat(ASK, 200, tools=TOOLS, tool_choice="auto", grammar=answer, parallel_tool_calls=False,
                        temperature=1.0, seed=seed)  # fmt: skip
        if r.finish_reason == "length":  # a random model may run to its length inside a call's arguments
            continue
        if r.tool_calls:
            check_calls(r)
            seen.add("call")
        else:
            assert re.fullmatch(language, r.text), r.text
            seen.add("answer")
    assert seen, "every run ran to its length"
    assert engine.check()["locked_blocks"] == 0


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        (GrammarSpec.regex("a(b"), "regex"),
        (GrammarSpec.ebnf("root ::= foo", path="grammar"), "grammar"),
        (GrammarSpec.ebnf("start: undefined_rule", path="grammar"), "grammar"),
    ],
)
def test_a_bad_answer_grammar_beside_tools_names_its_own_field(engine: Engine, answer: GrammarSpec, field: str) -> None:
    """Nested in the grammar of calls, the answer's mistake would have named `tools`; it names its own field."""
    kw: dict[str, Any] = {"tools": TOOLS, "tool_choice": "auto", "grammar": answer}
    with pytest.raises(GrammarError) as caught:
        engine.chat(ASK, 4, **kw)
    assert caught.value.path == field, caught.value
