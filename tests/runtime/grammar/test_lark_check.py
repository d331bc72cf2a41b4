"""An EBNF grammar the library would crash on is refused before it is compiled (runtime/grammar/lark_check.py): a
Lark `%json { ... }` schema skipped every schema check (a `const` of -2**63 + 1 crashed the process, a NaN was read as
null), and a chain of 3,000 rules each naming the next overflowed the compiler's stack (a segfault). Recursive
grammars, and chains as deep as the bound, still compile and give sentences."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import numpy as np
import pytest

from radixcache.runtime.grammar import GrammarCompiler, GrammarError, GrammarSpec, GrammarState, allocate_masks
from radixcache.runtime.grammar.lark_check import MAX_RULE_DEPTH, MAX_RULE_SIZE, check_lark
from radixcache.runtime.tools.schema import json_rule
from tests.runtime.grammar.conftest import token_table, walk


def _text(state: GrammarState, tokenizer: Any, seed: int) -> str:
    return str(tokenizer.decode(walk(state, token_table(tokenizer, state.vocab), seed)))


def _lark_chain(rules: int) -> str:
    return "start: a0\n" + "".join(f'a{i}: a{i + 1} "x"\n' for i in range(rules)) + f'a{rules}: "y"\n'


def _gbnf_chain(rules: int) -> str:
    return "root ::= a0\n" + "".join(f'a{i} ::= a{i + 1} "x"\n' for i in range(rules)) + f'a{rules} ::= "y"\n'


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ('{"type": "integer", "const": NaN}', "%json.const"),  # read as null: the grammar forced `null`
        ('{"type": "integer", "const": -9223372036854775807}', "%json.const"),  # crashed the process
        ('{"type": "integer", "minimum": -9223372036854775808, "maximum": 0}', "%json.minimum"),
        ('{"$defs": {"a": {"$ref": "#/$defs/b"}}, "$ref": "#/$defs/a"}', "%json.$defs.a.$ref"),
    ],
)
def test_a_json_schema_inside_a_lark_grammar_is_checked_as_a_schema(
    tiny_compiler: GrammarCompiler, schema: str, where: str
) -> None:
    grammar = f'start: "n=" value\nvalue: %json {schema}\n'
    with pytest.raises(GrammarError) as info:
        tiny_compiler.compile(GrammarSpec.ebnf(grammar, path="grammar"))
    assert info.value.path == "grammar"
    assert info.value.reason.startswith(f"its schema at {where}: ")


@pytest.mark.parametrize("chain", [_lark_chain, _gbnf_chain])
def test_rules_chaining_past_the_bound_are_refused_and_within_it_compile(
    tiny_compiler: GrammarCompiler, tiny_tokenizer: Any, chain: Any
) -> None:
    deep = chain(MAX_RULE_DEPTH)
    with pytest.raises(GrammarError, match=f"its rules chain {MAX_RULE_DEPTH + 2} deep") as info:
        tiny_compiler.compile(GrammarSpec.ebnf(deep, path="grammar"))
    assert info.value.path == "grammar"
    fits = chain(MAX_RULE_DEPTH - 2)
    state = GrammarState(tiny_compiler.compile(GrammarSpec.ebnf(fits, path="grammar")))
    text = _text(state, tiny_tokenizer, 0)
    assert text == "y" + "x" * (MAX_RULE_DEPTH - 2)


def test_recursive_grammars_and_a_json_schema_inside_one_still_compile(
    tiny_compiler: GrammarCompiler, tiny_tokenizer: Any
) -> None:
    grammars = {
        'start: list\nlist: item | list "," item\nitem: /[0-9]/\n': r"[0-9](,[0-9])*",
        'start: "n=" value\nvalue: %json {"type": "integer", "minimum": 0, "maximum": 9}\n': r"n=[0-9]",
        'start: expr\nexpr: "(" expr ")"\n    | "x"\n': r"\(*x\)*",
    }
    for grammar, pattern in grammars.items():
        state = GrammarState(tiny_compiler.compile(GrammarSpec.ebnf(grammar, path="grammar")))
        assert re.fullmatch(pattern, _text(state, tiny_tokenizer, 1))


def test_names_inside_literals_and_comments_are_no_rules() -> None:
    grammar = (
        "start: a // b c\n"
        'a: b "c d" /e f/\n'
        '  | "start: c"\n'
        "b: %json " + json.dumps({"title": "c d e"}) + "\n"
        'c: d\nd: e\ne: "z"\n'
    )
    check_lark(grammar, "grammar", limit=3)  # start -> a -> b; c -> d -> e is a chain of its own
    with pytest.raises(GrammarError, match="its rules chain 3 deep"):
        check_lark(grammar, "grammar", limit=2)


@pytest.mark.parametrize(
    "grammar",
    [
        _lark_chain(3000),
        # just past the bound, not 3,000 rules: the library's GBNF-to-Lark conversion, which the check reads the
        # grammar through, grows with the square of the rules (3,000 took 4 s per constructor, 17 s in all)
        _gbnf_chain(MAX_RULE_DEPTH),
        'start: "n=" value\nvalue: %json {"type": "integer", "const": -9223372036854775807}\n',
    ],
    ids=["lark-chain", "gbnf-chain", "json-const"],
)
def test_a_users_grammar_is_checked_when_its_spec_is_made_by_any_constructor(grammar: str) -> None:
    """The checks run where a user's grammar enters, its spec, so wherever it goes after (compiled alone; nested
    beside tool calls under tool_choice "auto", runtime/grammar/nested.py, where these grammars crashed the process
    in the library's validation) it was checked. They ran in the compiler, skipped for a spec flagged as the
    runtime's own: the direct constructor and `dataclasses.replace` made unchecked specs, and a nested grammar
    needed a check of its own."""
    makers = [
        lambda: GrammarSpec.ebnf(grammar, path="grammar"),
        lambda: GrammarSpec("ebnf", grammar, path="grammar"),
        lambda: dataclasses.replace(GrammarSpec.ebnf('start: "a"', path="grammar"), source=grammar),
        lambda: dataclasses.replace(GrammarSpec.assembled('start: "a"', path="grammar"), source=grammar),
    ]
    for make in makers:
        with pytest.raises(GrammarError) as info:
            make()
        assert info.value.path == "grammar"
        assert "rules chain" in str(info.value) or "const" in str(info.value), info.value


def test_the_runtimes_own_grammar_keeps_the_library_options_a_users_may_not_set(
    tiny_compiler: GrammarCompiler, tiny_tokenizer: Any
) -> None:
    """A `%json` rule's `x-guidance` (the compact separators of every JSON grammar here) is refused in a user's
    grammar and taken in one the runtime assembles (tool_choice "auto" beside a schema)."""
    grammar = 'start: "n=" value\nvalue: ' + json_rule({"type": "integer", "minimum": 0, "maximum": 9}) + "\n"
    with pytest.raises(GrammarError, match="x-guidance"):
        GrammarSpec.ebnf(grammar, path="grammar")
    state = GrammarState(tiny_compiler.compile(GrammarSpec.assembled(grammar)))
    assert state.compiled.spec.path == "tools"
    for token in tiny_tokenizer.encode("n=7", add_special_tokens=False):
        state.accept(token)
    assert state.is_complete()


def test_the_runtimes_own_grammar_is_an_ordinary_spec_made_by_its_constructor() -> None:
    """`assembled` goes through the constructor (it set the fields of a bare object, past `__post_init__`): its spec
    is the `ebnf` spec of the same text, equal, keyed and hashed alike, with no field telling how it was made, and
    only an EBNF grammar is taken that way."""
    text = 'start: "a" | "b"'
    made = GrammarSpec.assembled(text, path="grammar")
    assert made == GrammarSpec.ebnf(text, path="grammar") and hash(made) == hash(GrammarSpec.ebnf(text, path="grammar"))
    assert made.key == GrammarSpec.ebnf(text).key
    assert [f.name for f in dataclasses.fields(GrammarSpec)] == ["kind", "source", "strict", "any_whitespace", "path"]
    with pytest.raises(ValueError, match="only an EBNF grammar"):
        GrammarSpec("regex", "[a-z]+", path="regex", assembled_by_runtime=True)


@pytest.mark.parametrize(
    "grammar",
    ["start: /(a{1000}){1000}/", "start: A\nA: /a{1000000}/i", 'start: "x" /[a\\/b]{20000}/ "y"'],
)
def test_a_regex_literal_past_the_size_bound_is_refused_naming_the_grammar(
    tiny_compiler: GrammarCompiler, grammar: str
) -> None:
    """A Lark regex literal is compiled as a `regex` spec is: `/(a{1000}){1000}/` took the library 4 s, and
    `/a{1000000}/` 1.8 s; each is refused by the size check (its words) at the grammar's path. Realistic literals
    still compile."""
    with pytest.raises(GrammarError, match=r"its regex /.*expands to more than 10,000 parts") as e:
        tiny_compiler.compile(GrammarSpec.ebnf(grammar, path="grammar"))
    assert e.value.path == "grammar"
    fine = 'start: /[a-z]{1,64}/ "@" /\\d{4}-\\d{2}-\\d{2}/ /.{0,1000}/'
    assert isinstance(GrammarState(tiny_compiler.compile(GrammarSpec.ebnf(fine))), GrammarState)


@pytest.mark.parametrize(
    ("grammar", "terminal"),
    [
        ('start: A\nA: ("a"{1000}){1000}', "A"),  # took the library 5 s
        ('start: "x" A\nA: B~1000\nB: C ~ 100..100\nC: "ab" "c"', "A"),  # names inlined: 3 * 100 * 1000 parts
        ("start: _W\n_W: /[a-z]{1,200}/ ~ 100", "_W"),  # each literal within the bound, not the terminal
    ],
)
def test_a_terminal_past_the_size_bound_is_refused_naming_it(
    tiny_compiler: GrammarCompiler, grammar: str, terminal: str
) -> None:
    """A terminal is compiled into one regex, the terminals it names inlined, so its repetitions multiply as a
    regex's do; one past the bound is refused naming it, and terminals within it (a chain of them, an imported
    one) still compile."""
    with pytest.raises(GrammarError, match=rf"its terminal {terminal}: the regex expands to more than") as e:
        tiny_compiler.compile(GrammarSpec.ebnf(grammar, path="grammar"))
    assert e.value.path == "grammar"
    fine = 'start: A " " NAME\nA: B~10\nB: C ~ 10..100\nC: "ab" /[0-9]{1,4}/\n%import common.CNAME -> NAME'
    assert isinstance(GrammarState(tiny_compiler.compile(GrammarSpec.ebnf(fine))), GrammarState)


@pytest.mark.parametrize(
    ("grammar", "rule"),
    [
        ('start: "a"{1000000}', "start"),  # compiled in ~40 ms, then failed the request at its first token
        ('start: ("a"{1000}){1000}', "start"),
        ('start: "x" pair\npair: ("a" "b"){5001}', "pair"),  # 10,002 lexemes: each literal counts 1
        ("start: row~101\nrow: cell~100\ncell: /[0-9]/", "start"),  # named rules multiplied in: 10,100
        ('root ::= "a"{1000000}', "start"),  # GBNF, converted to Lark (its root is Lark's start)
    ],
)
def test_a_rule_past_the_size_bound_is_refused_naming_it(
    tiny_compiler: GrammarCompiler, grammar: str, rule: str
) -> None:
    """A rule's repetitions are expanded by the library, which compiled `start: "a"{1000000}` and then failed the
    request at its first token (its parser's 50,000 items for the forced prefix); it is refused before compile,
    naming the rule, at the grammar's path."""
    with pytest.raises(GrammarError, match=rf"its rule {rule}: it expands to more than {MAX_RULE_SIZE:,} items") as e:
        tiny_compiler.compile(GrammarSpec.ebnf(grammar, path="grammar"))
    assert e.value.path == "grammar"


@pytest.mark.parametrize(
    ("grammar", "start"),
    [("start: row~100\nrow: cell~100\ncell: /[0-9]/", "0123456789"), ('start: ("a" "b"){5000}', "ab")],
)
def test_a_rule_at_the_size_bound_takes_its_first_tokens(
    tiny_compiler: GrammarCompiler, tiny_tokenizer: Any, grammar: str, start: str
) -> None:
    """Exactly `MAX_RULE_SIZE` items: the parser's first steps (where past the bound it failed) take tokens."""
    state = GrammarState(tiny_compiler.compile(GrammarSpec.ebnf(grammar, path="grammar")))
    row = allocate_masks(1, state.vocab.vocab_size)[0]
    taken = b""
    for _ in range(3):
        state.allowed_mask(row)
        allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little"))
        token = int(next(t for t in allowed if t not in state.stop_ids))
        state.accept(token)
        taken += tiny_tokenizer.token_bytes(token)
    assert set(taken.decode()) <= set(start) and len(taken) >= 3


@pytest.mark.parametrize(
    ("grammar", "pattern"),
    [
        ('start: "x" item{1,20}\nitem: "a" | "b"', r"x[ab]{1,20}"),
        ('start: "[" item ("," item){0,100} "]"\nitem: /[0-9]{1,3}/', r"\[[0-9]{1,3}(,[0-9]{1,3}){0,100}\]"),
        (
            'start: value\nvalue: obj | arr | ESCAPED_STRING | SIGNED_NUMBER | "null"\n'
            'obj: "{" [pair ("," pair){0,50}] "}"\npair: ESCAPED_STRING ":" value\n'
            'arr: "[" [value ("," value){0,50}] "]"\n%import common.ESCAPED_STRING\n%import common.SIGNED_NUMBER\n',
            r"[\[{\"0-9n-].*",
        ),
        ('root ::= "x" item{1,20}\nitem ::= [a-z] [0-9]?', r"x([a-z][0-9]?){1,20}"),
    ],
)
def test_realistic_rule_repetitions_still_compile_and_give_sentences(
    tiny_compiler: GrammarCompiler, tiny_tokenizer: Any, grammar: str, pattern: str
) -> None:
    state = GrammarState(tiny_compiler.compile(GrammarSpec.ebnf(grammar, path="grammar")))
    assert re.fullmatch(pattern, _text(state, tiny_tokenizer, 2), re.DOTALL)
