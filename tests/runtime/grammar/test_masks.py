"""Applying grammar masks to a batch of logits rows in one call: equal to applying each request's mask to its own
row (a naive per-row loop over the unpacked booleans), rows without a grammar untouched, logits wider than the mask
disallowed past it; on CUDA too when a GPU is present."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixcache.runtime.grammar import GrammarSpec, GrammarState
from radixcache.runtime.grammar.masks import apply_masks, fill_masks, make_executor
from tests.runtime.grammar.schemas import NESTED, PERSON


def states_at_different_points(tiny_tokenizer, tiny_compiler) -> list[GrammarState | None]:
    specs = [GrammarSpec.json_schema(PERSON), None, GrammarSpec.regex(r"[0-9]+"), GrammarSpec.json_schema(NESTED), None]
    prefixes = ['{"name": "Al', "", "12", '{"id": 7, "owner": {"login": "x"}, ', ""]
    states: list[GrammarState | None] = []
    for spec, prefix in zip(specs, prefixes, strict=True):
        if spec is None:
            states.append(None)
            continue
        state = GrammarState(tiny_compiler.compile(spec))
        for t in tiny_tokenizer.encode(prefix, add_special_tokens=False):
            state.accept(t)
        states.append(state)
    return states


def per_row_reference(logits: torch.Tensor, states: list[GrammarState | None]) -> torch.Tensor:
    out = logits.clone()
    for i, state in enumerate(states):
        if state is None:
            continue
        masks, _ = fill_masks([state], state.vocab.vocab_size)
        for t in range(out.shape[1]):
            word, bit = divmod(t, 32)
            if t >= state.vocab.vocab_size or not (int(masks[0, word]) >> bit) & 1:
                out[i, t] = float("-inf")
    return out


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
)
def test_batch_application_equals_per_row(tiny_tokenizer, tiny_compiler, device: str) -> None:
    states = states_at_different_points(tiny_tokenizer, tiny_compiler)
    logits = torch.randn(len(states), 260, generator=torch.Generator().manual_seed(0))
    expected = per_row_reference(logits, states)
    masks, rows = fill_masks(states, 260)
    assert rows == [0, 2, 3]
    got = apply_masks(logits.to(device), masks, rows).cpu()
    assert torch.equal(got, expected)
    assert torch.equal(got[1], logits[1]) and torch.equal(got[4], logits[4])
    assert all(torch.isfinite(got[i]).any() for i in rows)
    # every row constrained (applied in place, no gather)
    full = [s for s in states if s is not None]
    masks, rows = fill_masks(full, 260)
    dense = logits[[0, 2, 3]].clone()
    assert torch.equal(apply_masks(dense.to(device), masks, rows).cpu(), expected[[0, 2, 3]])


def test_parallel_fill_equals_sequential_fill(tiny_tokenizer, tiny_compiler) -> None:
    states = states_at_different_points(tiny_tokenizer, tiny_compiler)
    ended = GrammarState(tiny_compiler.compile(GrammarSpec.regex("a")))
    for t in [*tiny_tokenizer.encode("a", add_special_tokens=False), tiny_tokenizer.eos_token_ids[0]]:
        ended.accept(t)
    states.append(ended)
    sequential, rows = fill_masks(states, 260)
    parallel, rows_par = fill_masks(states, 260, make_executor(2))
    assert rows == rows_par and (sequential == parallel).all()
    assert not sequential[-1].any()  # a finished request allows nothing


def test_logits_wider_than_the_mask_are_disallowed_past_it(tiny_tokenizer, tiny_compiler) -> None:
    state = GrammarState(tiny_compiler.compile(GrammarSpec.regex("a")))
    masks, rows = fill_masks([state], 260)
    logits = torch.zeros(1, 300)
    apply_masks(logits, masks, rows)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == tiny_tokenizer.encode(
        "a", add_special_tokens=False
    )


def test_no_grammar_rows_is_a_no_op() -> None:
    logits = torch.randn(3, 50)
    before = logits.clone()
    masks, rows = fill_masks([None, None, None], 50)
    assert rows == [] and torch.equal(apply_masks(logits, masks, rows), before)


def test_a_mask_row_of_the_wrong_layout_is_refused(tiny_compiler) -> None:
    state = GrammarState(tiny_compiler.compile(GrammarSpec.regex("a")))
    with pytest.raises(ValueError):
        state.allowed_mask(np.zeros((9, 2), dtype=np.int32)[:, 0])  # a strided column: not contiguous
    with pytest.raises(ValueError):
        state.allowed_mask(np.zeros(9, dtype=np.int64))
