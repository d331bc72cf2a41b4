"""A schema `pattern` whose negated class leaves out a quote or a backslash (`[^"]`, `[^\\]`): the grammar library
quoted a class holding every control character with the escapes `\\"` and `\\\\` whatever the class said, so `[^"]*`
let the model write `a\\"b`, a string holding a quote (a 200 failing its own schema); a positive class of the controls
(`[\\x00-\\x1f]`, `\\p{Cc}`, an alternation of them) did the same. Each part of a pattern that may match U+0000 now
leaves it out, which the library quotes exactly; checked against Python's `re` on the decoded string, for a schema
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
        ("[a-z--[^b]]", r"[[a-z--[^b]]--\x00]"),  # a set operation: the class taken whole, less NUL
        ("[^a&&b]", r"[^[a&&b]\x00]"),  # `^` negates the whole set expression: NUL joined to it, not to `b`
        ("^[a-z]+$", "^[a-z]+$"),  # no escape, no nested class: it holds no U+0000
        (r"^[\w.-]+$", r"^[[\w.-]--\x00]+$"),
        (r"(?s:.)x.\S\x00\p{Cc}", r"(?s:.)x.\S[\x00--\x00][\p{Cc}--\x00]"),  # `.`, `\S` hold a quote anyway
        ("(?x)a # [ \n[^b]", "(?x)a # [ \n[^\\x00b]"),  # a verbose comment's bracket opens no class
    ],
)
def test_each_part_that_may_match_nul_leaves_it_out(pattern: str, made: str) -> None:
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


# controls only, written as a positive class, a Unicode class, an ASCII class, an alternation; and any character
CONTROLS = [
    (r"^[\x00-\x1f]{1,3}$", r"^[\x00-\x1f]{1,3}$"),
    (r"^[\n\t\x00-\x1f]+$", r"^[\n\t\x00-\x1f]+$"),
    (r"^\p{Cc}+$", r"^[\x00-\x1f\x7f-\x9f]+$"),
    (r"^[[:cntrl:]]+$", r"^[\x00-\x1f\x7f]+$"),
    (r"^(?:\x00|[\x01-\x1f])+$", r"^[\x00-\x1f]+$"),
    (r"^(?s:.)+$", r"^(?s:.)+$"),
]


@pytest.mark.parametrize(("pattern", "python"), CONTROLS)
def test_a_pattern_admitting_every_control_character_admits_no_quote_it_leaves_out(
    tiny_compiler: GrammarCompiler, tiny_tokenizer: Any, pattern: str, python: str
) -> None:
    """Such a pattern let the model write `\\"` and `\\\\` (a quote, a backslash) in its string, as a negated class
    did: `[\\x00-\\x1f]+` took `"\\""`. Compiled from a request's response_format, as the server does."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}, "required": ["s"]}
    body = {"type": "json_schema", "json_schema": {"name": "c", "strict": True, "schema": schema}}
    compiled = tiny_compiler.compile(GrammarSpec.from_response_format(body))
    for value in ['"', "\\", "\n\t", "\x01\x1f", 'a"', "ab", "\u0085"]:
        text = json.dumps({"s": value}, ensure_ascii=False)  # U+0085 as itself, controls below U+0020 escaped
        assert _accepts(compiled, tiny_tokenizer, text) == bool(re.search(python, value)), text


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


@pytest.mark.parametrize("pattern", ['[^"]', "^[a-z]+$", r"(?s:.)x.\x00\p{Cc}", "[^a&&b]", "[^]a]", r"[^\x00-\x1f]"])
def test_a_pattern_made_quote_safe_is_kept_as_it_is(pattern: str) -> None:
    """The runtime's own grammars hold tools' patterns made safe already, and pass through the Lark rewrite again."""
    once = quote_safe_pattern(pattern)
    assert quote_safe_pattern(once) == once


@pytest.mark.parametrize("nested", [False, True], ids=["alone", "beside-tool-calls"])
def test_a_lark_grammars_json_pattern_admits_no_quote_it_leaves_out(
    tiny_compiler: GrammarCompiler, tiny_tokenizer: Any, nested: bool
) -> None:
    """A user's Lark `%json` rule is compiled as a json_schema is, but its patterns were passed as written: `[^"]*`
    let the model write `a\\"b` there. `// %json` in a comment and a `"%json"` literal are no rules."""
    schema = {"type": "string", "pattern": NO_QUOTE}
    lark = f'// %json {{"a": 1}}\nstart: "%json" | %json {json.dumps(schema)}\n'
    spec = GrammarSpec.ebnf(lark, path="grammar")
    if nested:  # tool_choice "auto" beside the grammar: the user's Lark nested in the runtime's
        spec = request_grammar(RequestOptions(grammar=spec, tool_use=ToolUse.of([TOOL], "auto")), TemplateFeatures())
    compiled = tiny_compiler.compile(spec)
    for value in ['a"b', "a\\b", "ab"]:
        assert _accepts(compiled, tiny_tokenizer, json.dumps(value)) == bool(re.search(NO_QUOTE, value)), value
    assert _accepts(compiled, tiny_tokenizer, "%json")
