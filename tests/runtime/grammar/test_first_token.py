"""Repetitions that can split one text many ways compiled, under every size bound (lark_check.py), and then failed
every request at its first token, after its prefill, on the engine's loop: the library's parser spends its 50,000
items following the splits of the forced text ("Too many items (limit 50000; ff_tokens)"), as did a schema requiring
a property whose schema requires it again. The compile now takes a few tokens on a copy of the start matcher: such a
grammar is a GrammarError naming the spec's path, never cached, at its first token or behind a short prefix;
realistic grammars and schemas still compile and give sentences."""

from __future__ import annotations

import re
from typing import Any

import llguidance
import numpy as np
import pytest

from radixcache.runtime.grammar import GrammarCompiler, GrammarError, GrammarSpec, GrammarState
from tests.runtime.grammar.conftest import token_table, walk
from tests.runtime.grammar.schemas import ALL

AMBIGUOUS = [
    'start: ("a"~2..4){200}',
    'start: ("a"~1..2){1000}',
    'start: ("a" "a"?){3000}',
    'start: ("a"{1,3}){2000}',
    'start: ("a"+){1000}',
]


@pytest.mark.parametrize("grammar", AMBIGUOUS)
def test_ambiguous_repetitions_are_refused_at_compile_naming_the_path(
    tiny_compiler: GrammarCompiler, grammar: str
) -> None:
    compiler = GrammarCompiler(tiny_compiler.vocab)
    spec = GrammarSpec.ebnf(grammar, path="grammar")
    for _ in range(2):  # refused again: the failed grammar was not cached as good
        with pytest.raises(GrammarError, match=r"parser gives up on its first token.*ambiguous repetitions") as e:
            compiler.compile(spec)
        assert e.value.path == "grammar" and "Too many items" in str(e.value)
    assert len(compiler) == 0 and compiler.misses == 0 and compiler.hits == 0


@pytest.mark.parametrize(
    ("grammar", "token"),
    [
        ('start: ("x" | "y") ("a"+){1000}', "second"),
        ('start: ("x" | "y") ("x" | "y") ("a"~2..4){200}', "third"),
        ('start: "q" ("x" | "y") ("x" | "y") ("a"+){1000}', "fourth"),
    ],
)
def test_a_grammar_whose_parser_gives_up_behind_a_short_prefix_is_refused_at_compile(
    tiny_compiler: GrammarCompiler, grammar: str, token: str
) -> None:
    """The compile took one token: a grammar that gives up at its second compiled, then failed every request there,
    after its prefill, on the engine's loop. It takes up to PROBE_TOKENS now, along the lowest allowed tokens."""
    compiler = GrammarCompiler(tiny_compiler.vocab)
    with pytest.raises(GrammarError, match=rf"parser gives up on its {token} token.*ambiguous repetitions") as e:
        compiler.compile(GrammarSpec.ebnf(grammar, path="grammar"))
    assert e.value.path == "grammar" and "Too many items" in str(e.value)
    assert len(compiler) == 0


@pytest.mark.parametrize("strict", [True, False])
def test_a_schema_requiring_itself_is_refused_at_compile(tiny_compiler: GrammarCompiler, strict: bool) -> None:
    """A required property whose schema requires it again forces `{"n": {"n": ...` without end: no finite value, and
    the request failed at its first token the same way."""
    schema = {"$defs": {"x": {"type": "object", "properties": {"n": {"$ref": "#/$defs/x"}}, "required": ["n"]}}}
    spec = GrammarSpec.json_schema(schema | {"$ref": "#/$defs/x"}, strict=strict)
    with pytest.raises(GrammarError, match=r"gives up on its first token.*requires it again") as e:
        GrammarCompiler(tiny_compiler.vocab).compile(spec)
    assert e.value.path == "response_format.json_schema.schema"


def test_the_library_alone_fails_such_a_grammar_at_its_first_token(tiny_compiler: GrammarCompiler) -> None:
    """The refusal's premise, on a matcher built straight from the library: its first mask is fine, its first
    allowed token leaves it in error."""
    vocab = tiny_compiler.vocab
    matcher = llguidance.LLMatcher(vocab.lib, llguidance.grammar_from("lark", AMBIGUOUS[0]), log_level=0)
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
    assert not matcher.is_error()
    token = int(next(t for t in np.flatnonzero(bits) if t not in vocab.stop_ids))
    matcher.consume_token(token)
    assert matcher.is_error() and "Too many items" in (matcher.get_error() or "")


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        (GrammarSpec.ebnf('start: "a"+ "b"', path="grammar"), r"a+b"),
        (GrammarSpec.ebnf('start: ("a" | "b")* "."', path="grammar"), r"[ab]*\."),
        (GrammarSpec.ebnf('start: ("ab"){100} "."', path="grammar"), r"(ab){100}\."),
        (GrammarSpec.ebnf('root ::= "x" [a-c]{1,20} "."', path="grammar"), r"x[a-c]{1,20}\."),
        (GrammarSpec.regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}"), r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
        (GrammarSpec.json_object(), r"\{.*\}"),
        *[(GrammarSpec.json_schema(schema), r"[\[{].*[\]}]") for schema in ALL.values()],
    ],
)
def test_realistic_grammars_still_compile_and_give_sentences(
    tiny_compiler: GrammarCompiler, tiny_tokenizer: Any, spec: GrammarSpec, pattern: str
) -> None:
    compiled = GrammarCompiler(tiny_compiler.vocab).compile(spec)
    state = GrammarState(compiled)
    text = str(tiny_tokenizer.decode(walk(state, token_table(tiny_tokenizer, state.vocab), 1, max_steps=800)))
    assert re.fullmatch(pattern, text, re.DOTALL), text
