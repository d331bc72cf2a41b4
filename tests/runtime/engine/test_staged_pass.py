"""A prefill chunk run over several passes by layers (model.staged) computes what one pass computes: the same
last-position logits, the same K/V in the pool, and the decodes beside each of its passes the same logits as alone.
Layer ranges and hidden rows that do not fit are refused with what was wrong."""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.batch import DecodeBatch, PrefillChunk
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.testing import tiny_model

TOL = 1e-4
PAGE = 4
LAYERS = 5


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(1, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    m = tiny_model(seed=3, num_layers=LAYERS)
    return LlamaModel(m.config, m.weights)


def _setup(model: LlamaModel) -> tuple:
    """A pool holding a 19-token cached prefix (sequence A) and a 9-token decode's prompt (sequence B)."""
    pool = model.new_pool(64, PAGE)
    seq_a, seq_b = _tokens(30, 1), _tokens(10, 2)
    table_a, table_b = list(range(0, 8)), list(range(20, 23))
    model.prefill(seq_a[:19], 0, table_a, pool)
    model.prefill(seq_b[:-1], 0, table_b, pool)
    return pool, seq_a, seq_b, table_a, table_b


def _decode(model: LlamaModel, seq_b: list[int], table_b: list[int], step: int) -> DecodeBatch:
    """B's decode of its token at position 9 + step (the earlier steps' tokens are B's own ids, fed in order)."""
    meta = build_decode_meta([table_b], [10 + step], PAGE, model.device)
    return DecodeBatch([(seq_b + _tokens(8, 9))[9 + step]], meta)


@pytest.mark.parametrize("stages", [[(0, 2), (2, 4), (4, 5)], [(0, 1), (1, 5)], [(0, 4), (4, 5)]])
@pytest.mark.parametrize("with_decode", [False, True])
def test_a_chunk_staged_by_layers_equals_one_pass(model: LlamaModel, stages: list, with_decode: bool) -> None:
    pool, seq_a, seq_b, table_a, table_b = _setup(model)
    chunk = PrefillChunk(seq_a[19:30], 19, table_a)
    want = model.forward(pool, chunks=[chunk])
    assert want.chunks is not None and want.hidden == ()
    slots = pool.slots(torch.tensor(table_a), torch.arange(19, 30))
    want_kv = [tuple(t.flatten(0, 1)[slots].clone() for t in pool.layer(i)) for i in range(LAYERS)]
    alone = [model.forward(pool, decode=_decode(model, seq_b, table_b, s)).decode for s in range(len(stages))]

    pool, seq_a, seq_b, table_a, table_b = _setup(model)  # again, from a pool without the chunk's K/V
    for i in range(LAYERS):
        for t in pool.layer(i):
            t.flatten(0, 1)[slots] = 0.0
    hidden = None
    for s, (first, stop) in enumerate(stages):
        part = PrefillChunk(seq_a[19:30], 19, table_a, (first, stop), hidden)
        decode = _decode(model, seq_b, table_b, s) if with_decode else None
        out = model.forward(pool, decode=decode, chunks=[part])
        if with_decode:
            assert out.decode is not None and (out.decode - alone[s]).abs().max().item() < TOL
        if stop < LAYERS:
            assert out.chunks is None and out.hidden[0] is not None and out.hidden[0].shape == (11, 32)
            for i in range(stop, LAYERS):  # no layer past the range has written the chunk's K/V yet
                assert all(t.flatten(0, 1)[slots].abs().max().item() == 0.0 for t in pool.layer(i))
            hidden = out.hidden[0]
        else:
            assert out.hidden == (None,) and out.chunks is not None
            assert (out.chunks[0] - want.chunks[0]).abs().max().item() < TOL
    for i in range(LAYERS):
        for got, ref in zip((t.flatten(0, 1)[slots] for t in pool.layer(i)), want_kv[i], strict=True):
            assert (got - ref).abs().max().item() < TOL


def test_a_staged_chunk_beside_a_whole_one_keeps_the_order_of_the_logits(model: LlamaModel) -> None:
    """Logits rows are the decodes' and then those of the chunks that ran their last layer, in order."""
    pool, seq_a, seq_b, table_a, table_b = _setup(model)
    whole = PrefillChunk(seq_b[-1:], 9, table_b)
    want = model.forward(pool, chunks=[whole]).chunks
    pool, seq_a, seq_b, table_a, table_b = _setup(model)
    out = model.forward(pool, chunks=[PrefillChunk(seq_a[19:30], 19, table_a, (0, 2)), whole])
    assert out.chunks is not None and out.chunks.shape[0] == 1
    assert want is not None and (out.chunks[0] - want[0]).abs().max().item() < TOL
    assert out.hidden[0] is not None and out.hidden[1] is None


@pytest.mark.parametrize(
    ("layers", "hidden_rows", "message"),
    [
        ((0, 0), None, r"layers \(0, 0\) are not within 0 .. 5"),
        ((3, 2), 11, r"layers \(3, 2\) are not within"),
        ((0, 6), None, r"layers \(0, 6\) are not within"),
        ((-1, 2), None, r"not within"),
        ((2, 5), None, r"entering layer 2 needs its hidden rows"),
        ((0, 3), 11, r"entering layer 0 needs its hidden rows exactly when"),
        ((2, 5), 7, r"a chunk of 11 tokens entering layer 2 needs hidden rows \[11, 32\]"),
    ],
)
def test_layers_or_hidden_rows_that_do_not_fit_are_refused(
    model: LlamaModel, layers: tuple[int, int], hidden_rows: int | None, message: str
) -> None:
    pool, seq_a, _, table_a, _ = _setup(model)
    hidden = None if hidden_rows is None else torch.zeros(hidden_rows, 32)
    before = [t.clone() for t in pool.layer(0)]
    with pytest.raises(ValueError, match=message):
        model.forward(pool, chunks=[PrefillChunk(seq_a[19:30], 19, table_a, layers, hidden)])
    assert all(torch.equal(a, b) for a, b in zip(before, pool.layer(0), strict=True)), "nothing was written"
