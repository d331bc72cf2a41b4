"""A regex or EBNF spec as a rule body another Lark grammar can nest: how tool_choice "auto" beside a `regex` or
`grammar` constraint admits either the model's tool calls or an answer in that grammar (runtime.engine.tool_calls).

`nested_rule(spec)` gives `%lark { ... }` (llguidance's nested grammar, with a lexer of its own, so the answer's
terminals never meet those of the grammar around it): a regex as the one-terminal grammar the library makes of it
(`start: /.../`), GBNF converted to Lark as the compiler converts it, Lark as written. The answer is validated alone
first (no vocabulary needed), so a mistake in it is a `GrammarError` naming the field the caller gave it in
(`regex`, `grammar`), not the combined grammar's `tools`. JSON specs are not nested here: their `%json` rule is
built beside the calls' (runtime.tools.schema.auto_answer_grammar).
"""

from __future__ import annotations

import json

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from radixcache.runtime.grammar.errors import GrammarError
from radixcache.runtime.grammar.lark_check import looks_like_lark, quote_safe_lark
from radixcache.runtime.grammar.spec import GrammarSpec


def nested_rule(spec: GrammarSpec) -> str:
    """`spec` (regex or ebnf) as a Lark rule body that nests it; GrammarError naming `spec.path` when the grammar
    is not valid on its own."""
    lark = _lark(spec)  # an EBNF spec's checks (lark_check.py) ran when it was made
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(lark)
    if is_error:
        raise GrammarError(" ".join(messages).strip() or "invalid grammar", spec.path)
    return "%lark {\n" + lark + "\n}"


def _lark(spec: GrammarSpec) -> str:
    if spec.kind == "regex":
        top = json.loads(llguidance.LLMatcher.grammar_from_regex(spec.source))
        return str(top["grammars"][0]["lark_grammar"])
    if spec.kind == "ebnf":
        if looks_like_lark(spec.source):
            return quote_safe_lark(spec.source)
        try:
            return str(any_to_lark(spec.source))
        except Exception as e:  # the converter raises assorted types for bad input
            raise GrammarError(f"not a valid GBNF grammar ({str(e).strip() or type(e).__name__})", spec.path) from None
    raise ValueError(f"a {spec.kind} spec is not nested as Lark")
