"""A regex whose counted repetitions expand past `MAX_REGEX_SIZE` parts is refused before the library compiles it,
naming its field: `(a{1000}){1000}` cost 3-4 s of a worker thread and a schema's `"pattern": "^a{1000000}$"` 1-2 s
before (the latter then refused naming the schema's root, or not at all). Realistic patterns, and the library's
Rust-like syntax that Python's `re` rejects, still compile. The size counted is checked against an independent
expansion: random patterns of literals and fixed counts, built beside the one string they match."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import pytest

from radixcache.runtime.grammar import GrammarCompiler, GrammarError, GrammarSpec, GrammarState
from radixcache.runtime.grammar.regex_size import MAX_REGEX_SIZE, regex_size

ROOT = "response_format.json_schema.schema"
REFUSED = "expands to more than 10,000 parts"  # the check's own words: not the library's refusal
HOSTILE = ["(a{1000}){1000}", "^a{1000000}$", "((a{10}){10}){101}", "(ab|cd){100}{100}", "[a-z]{1,20000}", "a{10001}"]
REALISTIC = [
    r"^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$",
    r"\d{4}-\d{2}-\d{2}",
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
    "[a-z]{1,64}",
    ".{0,1000}",
    r"\+?[0-9]{1,3}[ -]?\(?[0-9]{3}\)?[ -]?[0-9]{3}[ -]?[0-9]{4}",
    "a{10000}",  # the bound itself
]
RUST_ONLY = [r"\p{L}{3}", "[[:digit:]]{4}", r"(?<year>\d{4})-x"]  # Python's re refuses these; the library does not


@pytest.mark.parametrize("pattern", HOSTILE)
def test_a_hostile_regex_is_refused_by_the_size_check_naming_its_field(pattern: str) -> None:
    with pytest.raises(GrammarError, match=REFUSED) as e:
        GrammarSpec.regex(pattern)
    assert e.value.path == "regex"
    with pytest.raises(GrammarError, match=REFUSED):  # the constructor too, and so every spec made
        GrammarSpec("regex", pattern, path="body.regex")


@pytest.mark.parametrize("pattern", HOSTILE)
@pytest.mark.parametrize(
    ("schema", "where"),
    [
        (lambda p: {"type": "string", "pattern": p}, ".pattern"),
        (lambda p: {"type": "object", "properties": {"s": {"type": "string", "pattern": p}}}, ".properties.s.pattern"),
        (lambda p: {"type": "array", "items": {"type": "string", "pattern": p}}, ".items.pattern"),
        (lambda p: {"type": "object", "propertyNames": {"pattern": p}}, ".propertyNames.pattern"),
        (lambda p: {"type": "object", "patternProperties": {p: {"type": "integer"}}}, None),
    ],
)
def test_a_hostile_schema_pattern_is_refused_naming_its_path(
    pattern: str, schema: Callable[[str], dict[str, Any]], where: str | None
) -> None:
    with pytest.raises(GrammarError, match=REFUSED) as e:
        GrammarSpec.json_schema(schema(pattern))
    assert e.value.path == ROOT + (where or f".patternProperties.{pattern}")


@pytest.mark.parametrize("pattern", REALISTIC + RUST_ONLY)
def test_realistic_and_rust_syntax_patterns_still_compile(tiny_compiler: GrammarCompiler, pattern: str) -> None:
    assert regex_size(pattern) <= MAX_REGEX_SIZE
    assert isinstance(GrammarState(tiny_compiler.compile(GrammarSpec.regex(pattern))), GrammarState)
    spec = GrammarSpec.json_schema({"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}})
    assert isinstance(GrammarState(tiny_compiler.compile(spec)), GrammarState)


def test_an_invalid_regex_is_still_the_librarys_to_refuse(tiny_compiler: GrammarCompiler) -> None:
    with pytest.raises(GrammarError) as e:
        tiny_compiler.compile(GrammarSpec.regex("(a{3}"))
    assert REFUSED not in str(e.value) and e.value.path == "regex"


def _random_pattern(rng: random.Random, depth: int) -> tuple[str, str]:
    """A pattern of literals, escapes, classes and fixed counts `{m}`, nested, and the one string it matches."""
    parts: list[tuple[str, str]] = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["lit", "esc", "class", "group"] if depth else ["lit", "esc", "class"])
        if kind == "lit":
            text = "".join(rng.choice("abc-") for _ in range(rng.randint(1, 3)))
            piece = (text, text)
        elif kind == "esc":
            piece = (r"\.", ".")
        elif kind == "class":
            piece = ("[x]", "x")
        else:
            inner, matched = _random_pattern(rng, depth - 1)
            piece = (f"({inner})", matched)
        if rng.random() < 0.6:  # a fixed count of the piece's last atom (a literal's last character)
            count = rng.randint(0, 5)
            pat, matched = piece
            last = pat[-1] if kind == "lit" else pat
            single = matched[-1] if kind == "lit" else matched
            head = pat[:-1] if kind == "lit" else ""
            piece = (f"{head}{last}{{{count}}}", (matched[:-1] if kind == "lit" else "") + single * count)
        parts.append(piece)
    return "".join(p for p, _ in parts), "".join(m for _, m in parts)


def test_the_size_counted_is_the_expansion_of_nested_fixed_counts() -> None:
    rng = random.Random(7)
    for _ in range(300):
        pattern, matched = _random_pattern(rng, 3)
        assert re.fullmatch(pattern, matched), pattern
        # every counted piece is at least 1 (a `{0}` still costs its body once), so compare with `{0}` as `{1}`
        ones = re.sub(r"\{0\}", "{1}", pattern)
        expected = len(_expand(ones))
        assert regex_size(ones, limit=10**9) == expected, ones


def _expand(pattern: str) -> str:
    """`pattern` (literals, `\\.`, `[x]`, groups, `{m}`) written out: each `X{m}` as m copies, innermost first."""
    text = pattern.replace(r"\.", ".").replace("[x]", "x")
    while True:
        out = re.sub(r"\(([^()]*)\)\{(\d+)\}", lambda m: m.group(1) * int(m.group(2)), text)
        out = re.sub(r"([^(){}\d])\{(\d+)\}", lambda m: m.group(1) * int(m.group(2)), out)
        out = re.sub(r"\(([^()]*)\)(?!\{)", r"\1", out)
        if out == text:
            return text
        text = out


@pytest.mark.parametrize("pattern", ["(a|b){5000}", "(a|b|c|d){3000}", r"(x|\d|[yz]){9000}", "(?:a|(b)){10000}"])
def test_a_group_of_one_atom_alternatives_counts_as_the_class_it_matches(
    tiny_compiler: GrammarCompiler, pattern: str
) -> None:
    """`(a|b){5000}` was refused (15,000 parts: each alternative and `|` counted) though the library compiles it as
    the class `[ab]{5000}`: ~1 ms on SmolLM2's vocabulary, as `(a|b){100000}`, where literal text costs (10,000
    characters ~50 ms, as `a{10000}`). Such a group counts 1; alternatives of more than one atom count whole."""
    assert regex_size(pattern) <= MAX_REGEX_SIZE
    state = GrammarState(tiny_compiler.compile(GrammarSpec.regex(pattern)))
    assert not state.is_complete() and state.error() is None
    for wider in ("(a?|b){5000}", "(ab|cd){3000}", "(a|bc){4000}"):
        with pytest.raises(GrammarError, match=REFUSED):
            GrammarSpec.regex(wider)
