"""The JSON schema a tool_choice allows in the generic format: under "required" and a named function, calls in the
generic format validate (jsonschema) and anything else (no call, an unknown or other name, extra keys, bad
arguments, two calls without parallel_tool_calls) does not; "auto" and "none", and templates with their own tool
syntax, are not constrained (None); auto as a Lark grammar allows calls or text not starting with "{" or whitespace.
The grammar engine accepts both, and text decoded under their masks from random logits with the tiny tokenizer
always parses into calls whose arguments validate (or, under auto, into text)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixcache.runtime.tools import (
    TemplateFeatures,
    ToolCall,
    auto_tool_grammar,
    generic_calls_text,
    normalize_tool_choice,
    parse_tool_calls,
    tool_call_schema,
)
from radixcache.runtime.tools.schema import call_schema, hermes_tool_grammar


def calls_json(*calls: tuple[str, dict]) -> dict:
    return json.loads(generic_calls_text([ToolCall(f"c{i}", n, json.dumps(a)) for i, (n, a) in enumerate(calls)]))


def valid(schema: dict, value: object) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_required_allows_calls_of_any_tool(specs) -> None:
    schema = tool_call_schema(specs, normalize_tool_choice("required", specs))
    jsonschema.Draft202012Validator.check_schema(schema)
    assert valid(schema, calls_json(("add", {"a": 1, "b": 2})))
    assert valid(schema, calls_json(("get_weather", {"city": "Oslo"}), ("now", {})))
    assert not valid(schema, {"tool_calls": []})
    assert not valid(schema, "plain text")
    assert not valid(schema, calls_json(("rm_rf", {})))
    assert not valid(schema, calls_json(("add", {"a": "one", "b": 2})))
    assert not valid(schema, calls_json(("get_weather", {"unit": "celsius"})))
    assert not valid(schema, {**calls_json(("now", {})), "extra": 1})
    assert not valid(schema, {"tool_calls": [{"name": "now", "arguments": {}, "id": "x"}]})


def test_parallel_tool_calls_false_allows_one_call(specs) -> None:
    schema = tool_call_schema(specs, normalize_tool_choice("required", specs), parallel_tool_calls=False)
    assert valid(schema, calls_json(("now", {})))
    assert not valid(schema, calls_json(("now", {}), ("now", {})))


def test_a_named_function_allows_only_it(specs) -> None:
    schema = tool_call_schema(specs, normalize_tool_choice({"type": "function", "function": {"name": "add"}}, specs))
    assert valid(schema, calls_json(("add", {"a": 1, "b": 2})))
    assert not valid(schema, calls_json(("now", {})))


def test_auto_none_and_hermes_templates_get_no_schema(specs) -> None:
    assert tool_call_schema(specs, normalize_tool_choice("auto", specs)) is None
    assert tool_call_schema(specs, normalize_tool_choice("none", specs)) is None
    hermes = TemplateFeatures(uses_tools=True, tool_role=True, hermes=True)
    required = normalize_tool_choice("required", specs)
    assert tool_call_schema(specs, required, features=hermes) is None
    generic = tool_call_schema(specs, required, features=TemplateFeatures())
    assert generic is not None
    # a template that renders tools but writes no tags: the parser reads the same JSON, so the same schema
    assert tool_call_schema(specs, required, features=TemplateFeatures(uses_tools=True)) == generic


def test_hermes_calls_are_a_grammar_of_tags(specs) -> None:
    required = normalize_tool_choice("required", specs)
    assert hermes_tool_grammar(specs, normalize_tool_choice("auto", specs)) is None
    parallel = hermes_tool_grammar(specs, required)
    single = hermes_tool_grammar(specs, required, parallel_tool_calls=False)
    assert parallel is not None and single is not None
    assert '"<tool_call>\\n" call "\\n</tool_call>"' in single and "*" in parallel and "*" not in single.split("\n")[0]
    call = json.loads(single.split("%json ", 1)[1])
    assert call.pop("x-guidance")["whitespace_flexible"] is False  # compact, as every JSON grammar here
    assert call == {"anyOf": [call_schema(t) for t in specs]}


@pytest.mark.slow
def test_decoding_under_the_schema_gives_valid_calls(tiny_tokenizer, specs) -> None:
    grammar = pytest.importorskip("radixcache.runtime.grammar")
    from tests.runtime.grammar.conftest import token_table, walk

    compiler = grammar.GrammarCompiler(grammar.build_vocab(tiny_tokenizer, vocab_size=260))
    params = {t.name: t.parameters for t in specs}
    choices = ["required", *({"type": "function", "function": {"name": t.name}} for t in specs)]
    for choice, parallel in [(c, p) for c in choices for p in (True, False)]:
        schema = tool_call_schema(specs, normalize_tool_choice(choice, specs), parallel_tool_calls=parallel)
        compiled = compiler.compile(grammar.GrammarSpec.json_schema(schema, path="tools"))
        table = token_table(tiny_tokenizer, compiled.vocab)
        for seed in range(3):
            ids = walk(grammar.GrammarState(compiled), table, seed, close_after=40 + 20 * seed)
            text = tiny_tokenizer.decode(ids, skip_special_tokens=False)
            jsonschema.validate(json.loads(text), schema)
            parsed = parse_tool_calls(text, specs)
            assert parsed.tool_calls and parsed.content is None, text
            for call in parsed.tool_calls:
                jsonschema.validate(json.loads(call.arguments), params[call.name])
            # compact JSON as the grammar writes it re-renders to the same text without the memory
            assert generic_calls_text(parsed.tool_calls) == text


@pytest.mark.slow
def test_auto_as_a_grammar_gives_calls_or_text(tiny_tokenizer, specs) -> None:
    grammar = pytest.importorskip("radixcache.runtime.grammar")
    from tests.runtime.grammar.conftest import token_table, walk

    assert auto_tool_grammar((), parallel_tool_calls=True) is None
    assert auto_tool_grammar(specs, features=TemplateFeatures(uses_tools=True, hermes=True)) is None
    compiler = grammar.GrammarCompiler(grammar.build_vocab(tiny_tokenizer, vocab_size=260))
    compiled = compiler.compile(grammar.GrammarSpec.assembled(auto_tool_grammar(specs)))
    schema = tool_call_schema(specs, normalize_tool_choice("required", specs))
    for text, allowed in [("Sunny.", True), (CALL, True), ('{"a": 1}', False), (" hi", False), ("", False)]:
        state = grammar.GrammarState(compiled)
        try:
            for token in tiny_tokenizer.encode(text, add_special_tokens=False):
                state.accept(token)
            ok = state.is_complete()
        except grammar.GrammarError:
            ok = False
        assert ok is allowed, text
    table = token_table(tiny_tokenizer, compiled.vocab)
    kinds = set()
    brace = tiny_tokenizer.encode("{", add_special_tokens=False)
    for seed in range(6):
        state = grammar.GrammarState(compiled)
        for token in brace if seed % 2 else []:  # random logits rarely pick "{": start half the walks with it
            state.accept(token)
        ids = (brace if seed % 2 else []) + walk(state, table, seed, close_after=30)
        text = tiny_tokenizer.decode(ids, skip_special_tokens=False)
        parsed = parse_tool_calls(text, specs)
        if text.startswith("{"):
            jsonschema.validate(json.loads(text), schema)
            assert parsed.tool_calls, text
        else:
            assert not parsed.tool_calls and parsed.content == text
        kinds.add(bool(parsed.tool_calls))
    assert kinds == {True, False}


CALL = '{"tool_calls": [{"name": "now", "arguments": {}}]}'
