"""The batch's greedy pick (engine.output.greedy_tokens): float32 CPU rows go through numpy's argmax, anything else
through one batched torch argmax; both must give a naive reference's answer: the first index of the maximum, or
None where the maximum is not finite (a NaN anywhere counts as the maximum, as both libraries treat it)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime.engine.output import greedy_tokens

SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0])
VALUE = st.one_of(st.floats(-4, 4, width=32), SPECIAL)  # few distinct values: ties are common
# rows of one length, drawn as such (a filter on lists of any lengths threw away most of what it drew)
ROWS = st.integers(1, 12).flatmap(lambda n: st.lists(st.lists(VALUE, min_size=n, max_size=n), min_size=1, max_size=4))


def reference(row: list[float]) -> int | None:
    """A NaN first (the first one), else the first index of the largest value; None if that is not finite."""
    nans = [i for i, v in enumerate(row) if math.isnan(v)]
    if nans:
        return None
    best = max(range(len(row)), key=lambda i: (row[i], -i))
    return best if math.isfinite(row[best]) else None


@settings(max_examples=300, deadline=None)
@given(ROWS)
def test_float32_cpu_rows_pick_the_reference_token(rows: list[list[float]]) -> None:
    tensors = [torch.tensor(r, dtype=torch.float32) for r in rows]
    assert list(greedy_tokens(tensors)) == [reference(r) for r in rows]


@settings(max_examples=300, deadline=None)
@given(ROWS)
def test_other_rows_take_the_batched_path_with_the_same_answers(rows: list[list[float]]) -> None:
    tensors = [torch.tensor(r, dtype=torch.float64) for r in rows]  # not float32: the torch path
    assert list(greedy_tokens(tensors)) == [reference(r) for r in rows]


def test_rows_of_a_logits_matrix_and_an_empty_batch() -> None:
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0))
    assert list(greedy_tokens(list(logits))) == logits.argmax(dim=-1).tolist()
    assert list(greedy_tokens([])) == []


def test_pass_tokens_take_the_heads_token_only_for_plain_greedy_rows_no_grammar_masked() -> None:
    """Against the rule restated: a plain-greedy row without a grammar takes the token the pass found; one the pass
    did not find, or whose grammar masked the row, takes its row's argmax; any other row gets None (its sampler)."""
    from types import SimpleNamespace

    from radixcache.runtime.engine.output import pass_tokens

    def req(plain: bool, grammar: object = None) -> SimpleNamespace:
        return SimpleNamespace(sampler=SimpleNamespace(params=SimpleNamespace(plain_greedy=plain)), grammar=grammar)

    g = torch.Generator().manual_seed(5)
    rows = [torch.randn(50, generator=g) for _ in range(5)]
    reqs = [req(True), req(True), req(True, grammar="json"), req(False), req(False, grammar="json")]
    found = {id(reqs[0]): 7, id(reqs[2]): 9, id(reqs[3]): 11, id(reqs[4]): 13}  # the native head's picks
    done = list(zip(reqs, rows, strict=True))
    want = [7, int(rows[1].argmax()), int(rows[2].argmax()), None, None]
    assert pass_tokens(done, found) == want
    assert pass_tokens(done, {}) == [int(rows[i].argmax()) for i in range(3)] + [None, None]
    assert pass_tokens([], found) == []
