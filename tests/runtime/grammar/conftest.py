"""Fixtures for the grammar tests: the tiny checkpoint's tokenizer (SmolLM2's: tests/conftest.py), their grammar
compilers, and a random walk that decodes under the grammar mask (random logits, the disallowed ones set to -inf,
argmax) with a bias towards closing the output after a number of steps, so that every walk ends."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from radixcache.runtime.grammar import GrammarCompiler, GrammarState, GrammarVocab, allocate_masks, build_vocab
from radixcache.runtime.grammar.masks import apply_masks


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from radixcache.runtime.loading.tokenizer import Tokenizer
    from tests.cli.conftest import write_tiny_checkpoint

    return Tokenizer.from_hf_dir(write_tiny_checkpoint(tmp_path_factory.mktemp("grammar") / "tiny"))


@pytest.fixture(scope="session")
def tiny_compiler(tiny_tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(build_vocab(tiny_tokenizer, vocab_size=260))


@pytest.fixture(scope="session")
def smollm2_compiler(smollm2_tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(build_vocab(smollm2_tokenizer))


def token_table(tokenizer: Any, vocab: GrammarVocab) -> TokenTable:
    table = [tokenizer.token_bytes(i) if i < tokenizer.vocab_size else b"" for i in range(vocab.vocab_size)]
    return TokenTable(table)


class TokenTable:
    """Per token: its closing score (a quote highest, then brackets, then `,` and `.`; any other byte disqualifies)
    and its length, for the walk's closing phase."""

    def __init__(self, table: list[bytes]) -> None:
        weight = {ord('"'): 8, ord("}"): 4, ord("]"): 4, ord(","): 1, ord("."): 1}
        self.score = np.array(
            [min(weight.get(c, -99) for c in b) + max(weight.get(c, -99) for c in b) if b else -999 for b in table]
        )
        self.length = np.array([len(b) or 99 for b in table])


def walk(
    state: GrammarState, table: TokenTable, seed: int, *, close_after: int = 24, max_steps: int = 600
) -> list[int]:
    """Token ids (without the final stop token) decoded under the mask from random logits (argmax). After
    `close_after` steps it takes a stop token when allowed, else the allowed token that closes most, else the
    shortest allowed token."""
    vocab = state.vocab
    gen = torch.Generator().manual_seed(seed)
    row = allocate_masks(1, vocab.vocab_size)
    stops = np.array(vocab.stop_ids)
    out: list[int] = []
    for step in range(max_steps):
        state.allowed_mask(row[0])
        logits = torch.randn(1, vocab.vocab_size, generator=gen)
        apply_masks(logits, row, [0])
        allowed = torch.isfinite(logits[0]).nonzero().flatten().numpy()
        assert len(allowed), f"nothing allowed after {out}"
        token = int(logits[0].argmax())
        if step >= close_after:
            ok_stops = np.intersect1d(allowed, stops)
            if len(ok_stops):
                token = int(ok_stops[0])
            elif table.score[allowed].max() > 0:
                token = int(allowed[np.argmax(table.score[allowed])])
            else:
                token = int(allowed[np.argmin(table.length[allowed])])
        state.accept(token)
        if state.is_terminated():
            return out
        out.append(token)
    raise AssertionError(f"no end after {max_steps} steps: {out[-50:]}")
