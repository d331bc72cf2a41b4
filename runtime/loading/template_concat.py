"""Concatenation and output bounds of a chat template's render (template_sandbox.py wires them in as a template
compiles): `a + b + c` (`chain_of`, one call per chain; `add_checked`, one `+`), `a ~ b ~ c` (`joined`), a block's
text (`concat_in`, `concat_text`) and the render's output (`collect`).

Invariants: each result's size is checked against template_bounds' `MAX_CHARS` before it is made, and what it makes
is counted against the render's `MAX_MADE` (its `Budget`); a `+` costs a step of the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

from radixcache.runtime.loading.template_bounds import (
    ITEM_WEIGHT,
    MAX_CHARS,
    MAX_MADE,
    Budget,
    TemplateBoundError,
    check,
    fits,
    size_of,
    text_of,
    text_size,
)


def add_checked(budget: Budget, left: Any, right: Any) -> Any:
    size = size_of(left) + size_of(right)
    if size > MAX_CHARS:
        raise TemplateBoundError(f"a concatenation makes over {MAX_CHARS} characters or items")
    fits(budget, size * ITEM_WEIGHT if isinstance(left, list | tuple) else size, "a concatenation")
    return check(left + right, "the result of +", budget)


def chain_of(pattern: tuple[str | None, ...], steps: int, shown: bool = False) -> Callable[..., Any]:
    """`a + b + c ...` as one call, made once per chain as the template compiles: `pattern` is the chain's parts,
    its literal strings (adjacent ones merged) and None for each value it computes, which the call is passed;
    `steps` its `+`s, a step each. Strings (the common case) are checked and counted, then formatted into the
    literals at once; anything else is added pair by pair, each sum checked as `+` is (and, where the chain is
    written to the output, `shown`, the sum's size as text: `{{ [big] + [big] }}`)."""
    fmt = "".join("%s" if part is None else part.replace("%", "%%") for part in pattern)
    fixed = sum(len(part) for part in pattern if part is not None)

    def chain(context: Any, *values: Any) -> Any:
        budget = context.eval_ctx.budget
        budget.steps -= steps
        if budget.steps < budget.mark:
            budget.tick()
        size = fixed
        for value in values:
            if value.__class__ is not str:
                result = _pairwise(budget, pattern, values)
                if shown and result.__class__ is not str:
                    text_size(result, "an output", budget)
                return result
            size += len(value)
        if size > MAX_CHARS:
            raise TemplateBoundError(f"a concatenation makes over {MAX_CHARS} characters or items")
        budget.made -= size
        if budget.made < 0:
            raise TemplateBoundError(f"its results hold over {MAX_MADE} characters or items in all")
        return fmt % values

    return chain


def _pairwise(budget: Budget, pattern: tuple[str | None, ...], values: tuple[Any, ...]) -> Any:
    given = iter(values)
    parts = [next(given) if part is None else part for part in pattern]
    result = parts[0]
    for part in parts[1:]:
        result = add_checked(budget, result, part)
    return result


def joined(context: Any, *parts: Any) -> str:
    """`a ~ b ~ c ...`: the parts as text, their total checked before they are joined."""
    budget = context.eval_ctx.budget
    texts = [p if p.__class__ is str else text_of(p, "a ~ part", budget) for p in parts]
    size = sum(map(len, texts))
    if size > MAX_CHARS:
        raise TemplateBoundError(f"a ~ concatenation makes over {MAX_CHARS} characters")
    budget.made -= size
    if budget.made < 0:
        raise TemplateBoundError(f"its results hold over {MAX_MADE} characters or items in all")
    return "".join(texts)


def concat_text(parts: Iterable[str]) -> str:
    """Text gathered, refused over MAX_CHARS before it is joined."""
    texts = parts if isinstance(parts, list) else list(parts)
    if sum(map(len, texts)) > MAX_CHARS:
        raise TemplateBoundError(f"a block's text is over {MAX_CHARS} characters")
    return "".join(texts)


def concat_in(context: Any) -> Callable[[Iterable[str]], str]:
    """The render's `concat`, which joins a block's text (`{% set x %}...{% endset %}`, a macro's, a call block's):
    its size is checked as the parts are gathered, before they are joined, and counted."""
    budget = context.eval_ctx.budget

    def concat(parts: Iterable[str]) -> str:
        text = concat_text(parts)
        budget.made -= len(text)
        if budget.made < 0:
            raise TemplateBoundError(f"its results hold over {MAX_MADE} characters or items in all")
        return text

    return concat


def collect(chunks: Iterable[str]) -> str:
    """The render's output, refused once over MAX_CHARS. Gathered 32 chunks at a time (each chunk is text the
    template holds already, or made and counted against MAX_MADE), their total checked before any join."""
    out: list[str] = []
    total = 0
    chunks = iter(chunks)
    while batch := list(islice(chunks, 32)):
        total += sum(map(len, batch))
        if total > MAX_CHARS:
            raise TemplateBoundError(f"its output is over {MAX_CHARS} characters")
        out += batch
    return "".join(out)
