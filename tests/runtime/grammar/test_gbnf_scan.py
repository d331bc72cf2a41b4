"""A GBNF grammar's chain depth is checked before llguidance converts it to Lark (runtime/grammar/gbnf_scan.py): the
conversion's time grows with the square of a chain's length (3,000 chained rules took 3.4 s idle, 16 s under load;
a 128 KiB grammar holds ~8,000), and every chain past MAX_RULE_DEPTH was refused only after it. The verdict is the
one the check after the conversion gives; the scan skips literals, classes, counts and comments."""

from __future__ import annotations

import pytest
from llguidance.gbnf_to_lark import any_to_lark

from radixcache.runtime.grammar import GrammarError, GrammarSpec, lark_check
from radixcache.runtime.grammar.gbnf_scan import gbnf_uses
from radixcache.runtime.grammar.lark_check import MAX_RULE_DEPTH, check_lark


def _gbnf_chain(rules: int) -> str:
    return "root ::= a0\n" + "".join(f'a{i} ::= a{i + 1} "x"\n' for i in range(rules)) + f'a{rules} ::= "y"\n'


def test_a_chain_past_the_bound_is_refused_without_being_converted(monkeypatch: pytest.MonkeyPatch) -> None:
    def converter_called(text: str) -> str:
        raise AssertionError("the grammar was converted before its depth was checked")

    monkeypatch.setattr(lark_check, "any_to_lark", converter_called)
    with pytest.raises(GrammarError, match=r"chain 8,002 deep \(root -> a0 -> a1 -> \.\.\.\)") as info:
        GrammarSpec.ebnf(_gbnf_chain(8000))
    assert info.value.path == "ebnf"


@pytest.mark.parametrize("rules", [0, 1, 100, MAX_RULE_DEPTH - 2, MAX_RULE_DEPTH - 1, MAX_RULE_DEPTH + 40])
def test_the_verdict_is_the_converted_grammars(rules: int) -> None:
    text = _gbnf_chain(rules)
    try:
        check_lark(any_to_lark(text), "grammar")  # the check after the conversion, as before the scan
        expected = None
    except GrammarError as exc:
        expected = exc.reason.split(" (")[0]
    try:
        GrammarSpec.ebnf(text)
        got = None
    except GrammarError as exc:
        got = exc.reason.split(" (")[0]
    assert got == expected
    assert (got is None) == (rules + 2 <= MAX_RULE_DEPTH)


def test_the_scan_skips_literals_classes_counts_and_comments() -> None:
    text = (
        "root ::= a0 # b0 c0\n"
        'a0 ::= a1 "x y\\" z" [a-z b0]{2,3}\n'
        "  | a-1 [^\\]d0]+\n"
        'a1 ::= "y" | b-c\n'
        "b-c ::= (a0)? ws\n"
    )
    assert gbnf_uses(text) == {"root": ["a0"], "a0": ["a1", "a-1"], "a1": ["b-c"], "b-c": ["a0", "ws"]}
