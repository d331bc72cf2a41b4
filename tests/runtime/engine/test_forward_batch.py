"""One forward pass over running decodes and the prefill chunks of several sequences (model.batch) equals the plain
reference forward of each sequence alone: every part attends over its own KV, whatever else shares the pass."""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.batch import DecodeBatch, PrefillChunk
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.model.reference import reference_logits
from radixcache.runtime.testing import RandomModel

TOL = 1e-4


def tokens(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def tables(lengths: list[int], page: int, num_blocks: int, seed: int) -> list[list[int]]:
    """Disjoint shuffled block tables, one per sequence."""
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    out, at = [], 0
    for n in lengths:
        pages = -(-n // page)
        out.append(perm[at : at + pages])
        at += pages
    return out


@pytest.mark.parametrize("page", [1, 4, 16])
@pytest.mark.parametrize("with_decodes", [False, True])
def test_a_mixed_pass_equals_each_sequence_alone(tiny_variant: RandomModel, page: int, with_decodes: bool) -> None:
    cfg = tiny_variant.config
    model = LlamaModel(cfg, tiny_variant.weights)
    pool = model.new_pool(128, page)
    # Three decoding sequences (their prompts prefilled first) and three prefilling ones: one fresh, one over a
    # cached prefix, one a single token.
    dec_ids = [tokens(n, cfg.vocab_size, seed=10 + n) for n in (9, 17, 4)]
    pre_ids = [tokens(n, cfg.vocab_size, seed=20 + n) for n in (23, 30, 12)]
    starts = [0, 19, 11]
    tbl = tables([len(x) + 1 for x in dec_ids + pre_ids], page, 128, seed=page)  # room for one more token
    dec_tables, pre_tables = tbl[:3], tbl[3:]
    for ids, table in zip(dec_ids, dec_tables, strict=True):  # all but the last token: the decode computes it
        model.prefill(ids[:-1], 0, table, pool)
    for ids, start, table in zip(pre_ids, starts, pre_tables, strict=True):  # the cached prefixes
        if start:
            model.prefill(ids[:start], 0, table, pool)
    decode = None
    if with_decodes:
        lengths = [len(x) for x in dec_ids]
        meta = build_decode_meta(dec_tables, lengths, page, model.device)
        decode = DecodeBatch([x[-1] for x in dec_ids], meta)
    chunks = [
        PrefillChunk(ids[start:], start, table) for ids, start, table in zip(pre_ids, starts, pre_tables, strict=True)
    ]
    out = model.forward(pool, decode=decode, chunks=chunks)
    assert out.chunks is not None and out.chunks.shape == (3, cfg.vocab_size)
    for i, ids in enumerate(pre_ids):
        want = reference_logits(cfg, tiny_variant.weights, ids)[-1]
        assert (out.chunks[i] - want).abs().max().item() < TOL, f"chunk {i}"
    if with_decodes:
        assert out.decode is not None and out.decode.shape == (3, cfg.vocab_size)
        for i, ids in enumerate(dec_ids):
            want = reference_logits(cfg, tiny_variant.weights, ids)[-1]
            assert (out.decode[i] - want).abs().max().item() < TOL, f"decode {i}"
    else:
        assert out.decode is None
    # The pass wrote every new K/V: continuing each prefilled sequence by one decode step matches the reference.
    nxt = [int(out.chunks[i].argmax()) for i in range(3)]
    lengths = [len(x) + 1 for x in pre_ids]
    meta = build_decode_meta(pre_tables, lengths, page, model.device)
    step = model.decode(nxt, meta, pool)
    for i, ids in enumerate(pre_ids):
        want = reference_logits(cfg, tiny_variant.weights, [*ids, nxt[i]])[-1]
        assert (step[i] - want).abs().max().item() < TOL


def test_a_pass_refuses_what_it_cannot_run(tiny_variant: RandomModel) -> None:
    cfg = tiny_variant.config
    model = LlamaModel(cfg, tiny_variant.weights)
    pool = model.new_pool(8, 4)
    with pytest.raises(ValueError, match="decodes or prefill chunks"):
        model.forward(pool)
    with pytest.raises(ValueError, match="at least one token"):
        model.forward(pool, chunks=[PrefillChunk([], 0, [0])])
    with pytest.raises(ValueError, match="cannot hold"):
        model.forward(pool, chunks=[PrefillChunk([1] * 9, 0, [0, 1])])
    with pytest.raises(ValueError, match="max_position"):
        model.forward(pool, chunks=[PrefillChunk([1], cfg.max_position, list(range(8)))])
