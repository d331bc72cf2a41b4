"""A schema `pattern` whose negated class leaves out a quote or a backslash (`[^"]`, `[^\\]`): the grammar library
quoted a class holding every control character with the escapes `\\"` and `\\\\` whatever the class said, so `[^"]*`
let the model write `a\\"b`, a string holding a quote (a 200 failing its own schema). Each negated class now leaves out
U+0000 too, which the library quotes exactly; checked against Python's `re` on the decoded string, for a schema
compiled alone and for a tool's parameters in the Lark grammars the runtime assembles (Hermes tags, "auto" beside a
schema)."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest

from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.engine.tool_calls import request_grammar
from radixcache.runtime.grammar import GrammarCompiler, GrammarError, GrammarSpec, GrammarState
from radixcache.runtime.grammar.json_patterns import quote_safe_pattern
from radixcache.runtime.tools import TemplateFeatures, ToolUse
from tests.runtime.grammar.conftest import token_table, walk

NO_QUOTE = r'^[^"\\]{1,4}$'  # no quote, no backslash


@pytest.mark.parametrize(
    ("pattern", "made"),
    [
        ('[^"]', r'[^\x00"]'),
        (r'a[^"\\]b[^c]', r'a[^\x00"\\]b[^\x00c]'),
        ("[^]a]", r"[^]\x00a]"),  # a ] first in a class is the class's own
        (r"\[^a]", r"\[^a]"),  # an escaped bracket opens no class
        ("[a-z--[^b]]", "[a-z--[^b]]"),  # a set operation: kept as it is
        ("^[a-z]+$", "^[a-z]+$"),
    ],
)
def test_each_negated_class_leaves_out_nul_too(pattern: str, made: str) -> None:
    assert quote_safe_pattern(pattern) == made


def _accepts(compiled: Any, tokenizer: Any, text: str) -> bool:
    state = GrammarState(compiled)
    for token in tokenizer.encode(text, add_special_tokens=False):
        try:
            state.accept(token)
        except GrammarError:
            return False
    return state.is_complete()


@pytest.mark.parametrize("strict", [True, False])
def test_a_negated_class_admits_no_quote_or_backslash_it_leaves_out(
    tiny_compiler: GrammarCompiler, tiny_tokenizer: Any, strict: bool
) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": NO_QUOTE}}, "required": ["s"]}
    compiled = tiny_compiler.compile(GrammarSpec.json_schema(schema, strict=strict))
    for value in ['a"b', "a\\b", '"', "ab", "a\nb", "é😀"]:  # the library's answer against re's on the value
        text = json.dumps({"s": value}, ensure_ascii=False)
        assert _accepts(compiled, tiny_tokenizer, text) == bool(re.search(NO_QUOTE, value)), text
    table = token_table(tiny_tokenizer, tiny_compiler.vocab)
    for seed in range(12):
        out = json.loads(tiny_tokenizer.decode(walk(GrammarState(compiled), table, seed, close_after=3)))
        jsonschema.validate(out, schema)


TOOL = {
    "type": "function",
    "function": {
        "name": "say",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"s": {"type": "string", "pattern": NO_QUOTE}},
            "required": ["s"],
        },
    },
}


@pytest.mark.parametrize(
    ("options", "features", "call"),
    [
        (
            RequestOptions(tool_use=ToolUse.of([TOOL], "required", False)),
            TemplateFeatures(uses_tools=True, hermes=True),
            '<tool_call>\n{{"name": "say", "arguments": {args}}}\n</tool_call>',
        ),
        (
            RequestOptions(grammar=GrammarSpec.json_schema({"type": "boolean"}), tool_use=ToolUse.of([TOOL], "auto")),
            TemplateFeatures(),
            '{{"tool_calls": [{{"name": "say", "arguments": {args}}}]}}',
        ),
    ],
    ids=["hermes", "auto-beside-a-schema"],
)
def test_a_tools_pattern_in_an_assembled_grammar_is_quoted_alike(
    tiny_compiler: GrammarCompiler, tiny_tokenizer: Any, options: RequestOptions, features: Any, call: str
) -> None:
    spec = request_grammar(options, features)
    assert spec is not None and spec.kind == "ebnf"
    compiled = tiny_compiler.compile(spec)
    assert _accepts(compiled, tiny_tokenizer, call.format(args='{"s": "ab"}'))
    assert not _accepts(compiled, tiny_tokenizer, call.format(args='{"s": "a\\"b"}'))
