"""The paged forward pass equals the plain reference forward (radixcache.runtime.model.reference) on tiny random models:
Llama, Qwen2 with q/k/v bias, tied embeddings, wider GQA; any page size, chunking, block order and prefix split."""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.model.reference import reference_greedy, reference_logits
from radixcache.runtime.testing import RandomModel

TOL = 1e-4


def tokens(n: int, vocab: int, seed: int = 0) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def shuffled_table(n_pages: int, num_blocks: int, seed: int) -> list[int]:
    return torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))[:n_pages].tolist()


@pytest.mark.parametrize("page", [1, 5, 16])
@pytest.mark.parametrize(("split", "chunk"), [(0, 512), (0, 7), (19, 512), (32, 6)])
def test_prefill_over_a_cached_prefix_matches_reference(
    tiny_variant: RandomModel, page: int, split: int, chunk: int
) -> None:
    cfg = tiny_variant.config
    ids = tokens(45, cfg.vocab_size, seed=page)
    expected = reference_logits(cfg, tiny_variant.weights, ids)
    model = LlamaModel(cfg, tiny_variant.weights)
    pool = model.new_pool(64, page)
    table = shuffled_table(-(-45 // page), 64, seed=page + split)
    parts = []
    if split:
        parts.append(model.prefill(ids[:split], 0, table, pool, chunk_size=chunk, all_logits=True))
    parts.append(model.prefill(ids[split:], split, table, pool, chunk_size=chunk, all_logits=True))
    got = torch.cat(parts)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < TOL
    last = model.prefill(ids[split:], split, table, pool, chunk_size=chunk)  # default: last position only
    assert (last - expected[-1]).abs().max().item() < TOL


@pytest.mark.parametrize("page", [1, 4, 16])
def test_batched_decode_of_three_sequences_matches_reference(tiny_variant: RandomModel, page: int) -> None:
    cfg = tiny_variant.config
    model = LlamaModel(cfg, tiny_variant.weights)
    pool = model.new_pool(96, page)
    free = shuffled_table(96, 96, seed=page)
    seqs = [tokens(n, cfg.vocab_size, seed=n) for n in (4, 17, 30)]
    tables = []
    for s in seqs:  # prefill all but the last 3 tokens, then decode those 3 as one batch per step
        table = [free.pop() for _ in range(-(-len(s) // page))]
        tables.append(table)
        model.prefill(s[:-3], 0, table, pool)
    for step in (3, 2, 1):
        lengths = [len(s) - step + 1 for s in seqs]
        meta = build_decode_meta(tables, lengths, page, model.device)
        got = model.decode([s[n - 1] for s, n in zip(seqs, lengths, strict=True)], meta, pool)
        for i, (s, n) in enumerate(zip(seqs, lengths, strict=True)):
            expected = reference_logits(cfg, tiny_variant.weights, s[:n])[-1]
            assert (got[i] - expected).abs().max().item() < TOL


def test_float64_paged_forward_is_the_reference_function(tiny: RandomModel) -> None:
    """In float64 both sides are exact to far below 1e-4: a structural difference could not hide in the noise."""
    ids = tokens(40, tiny.config.vocab_size, seed=3)
    expected = reference_logits(tiny.config, tiny.weights, ids, dtype=torch.float64)
    model = LlamaModel(tiny.config, tiny.weights, dtype=torch.float64)
    pool = model.new_pool(16, 4)
    got = torch.cat(
        [
            model.prefill(ids[:21], 0, range(10), pool, all_logits=True),
            model.prefill(ids[21:], 21, range(10), pool, all_logits=True),
        ]
    )
    assert (got - expected).abs().max().item() < 1e-5


def test_reference_greedy_agrees_with_its_own_logits(tiny: RandomModel) -> None:
    ids = tokens(10, tiny.config.vocab_size, seed=5)
    out = reference_greedy(tiny.config, tiny.weights, ids, 3)
    assert out[0] == int(reference_logits(tiny.config, tiny.weights, ids)[-1].argmax())
    assert len(out) == 3


def test_positions_past_max_position_are_refused(tiny: RandomModel) -> None:
    model = LlamaModel(tiny.config, tiny.weights)
    pool = model.new_pool(200, 4)
    n = tiny.config.max_position + 1
    with pytest.raises(ValueError, match="max_position"):
        model.prefill([1] * n, 0, list(range(200)), pool)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_forward_matches_cpu(tiny: RandomModel) -> None:
    ids = tokens(30, tiny.config.vocab_size, seed=9)
    outs = []
    for device in ("cpu", "cuda"):
        model = LlamaModel(tiny.config, tiny.weights, device=device)
        pool = model.new_pool(8, 16)
        outs.append(model.prefill(ids, 0, [3, 1], pool, all_logits=True).cpu())
    assert (outs[0] - outs[1]).abs().max().item() < TOL
