"""A prefill chunk reads its cached prefix in place (model.prefix_pages): the plan covers exactly the prefix's
positions, and outputs equal a full recompute (the plain reference forward), the masked path that gathers the
whole sequence (what runs off the CPU), and an engine without a cache (greedy tokens exactly), for several chunks,
fragmented block tables, prefixes that end mid-page, and chunks that share a pass with running decodes."""

from __future__ import annotations

import random

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.model import chunk_rows, prefix_pages
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.batch import DecodeBatch, PrefillChunk
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.model.prefix_pages import MAX_PREFIX_RUNS, PrefixPlan, plan_prefix, prefix_pieces
from radixcache.runtime.model.reference import reference_logits
from radixcache.runtime.testing import RandomModel

TOL = 1e-4


def tokens(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(1, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def fragmented(pages: int, num_blocks: int, seed: int) -> list[int]:
    """A block table of runs of 1 to 5 consecutive blocks in shuffled order: some runs read in place, some gathered,
    more runs than MAX_PREFIX_RUNS once there are enough pages."""
    rng = random.Random(seed)
    starts, at = [], 0
    while at < num_blocks - 5:
        n = rng.randint(1, 5)
        starts.append(list(range(at, at + n)))
        at += n + rng.randint(0, 2)  # gaps: runs of the sorted ids do not merge
    rng.shuffle(starts)
    table = [b for run in starts for b in run]
    assert len(table) >= pages, "not enough blocks for the table"
    return table[:pages]


# ---------------------------------------------------------------------------------------------- the plan


def test_a_prefix_in_consecutive_blocks_is_one_view() -> None:
    assert plan_prefix([4, 5, 6, 7], 64, 16) == PrefixPlan(64, ((4, 4),), (), 0)


def test_the_partial_last_page_and_short_runs_are_gathered() -> None:
    # pages 9 and 0 are runs of one: gathered (full pages first), then the partial page 6 with its 5 positions
    assert plan_prefix([9, 3, 4, 0, 6], 69, 16) == PrefixPlan(69, ((3, 2),), (0, 9, 6), 37)
    assert plan_prefix([8], 3, 16) == PrefixPlan(3, (), (8,), 3)
    assert plan_prefix([8, 1], 0, 16) == PrefixPlan(0, (), (), 0)


def test_past_max_runs_the_longest_are_read_in_place() -> None:
    table = [b for i in range(MAX_PREFIX_RUNS + 2) for b in (10 * i, 10 * i + 1)]  # runs of 2 pages
    table += [500, 501, 502]  # the longest run
    plan = plan_prefix(table, len(table) * 4, 4)
    assert len(plan.runs) == MAX_PREFIX_RUNS and (500, 3) in plan.runs
    assert len(plan.gathered) == len(table) - sum(n for _, n in plan.runs)
    assert plan.in_place_tokens + plan.gathered_tokens == plan.length


def test_a_table_too_short_for_the_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot hold"):
        plan_prefix([1, 2], 33, 16)


@pytest.mark.parametrize("page", [1, 4, 16])
def test_the_pieces_hold_exactly_the_prefix_positions(page: int) -> None:
    """Each pool slot holds its own (block, offset) label; the pieces' rows, as a multiset, must be the labels of
    positions 0 .. length-1 read one by one through the table (an independent walk)."""
    blocks = 96
    k = torch.zeros(blocks, page, 1, 2)
    k[..., 0] = torch.arange(blocks).view(-1, 1, 1)
    k[..., 1] = torch.arange(page).view(1, -1, 1)
    v = -k
    rng = random.Random(page)
    for trial in range(30):
        table = fragmented(blocks // 2, blocks, seed=trial)
        length = rng.randint(0, len(table) * page)
        plan = plan_prefix(table, length, page)
        pieces = prefix_pieces(plan, k, v)
        got = sorted(tuple(r) for kp, _ in pieces for r in kp[:, 0].tolist())
        want = sorted((float(table[pos // page]), float(pos % page)) for pos in range(length))
        assert got == want, (table, length)
        assert all(torch.equal(vp, -kp) for kp, vp in pieces)
        views = [kp for kp, _ in pieces[: len(plan.runs)]]
        assert all(kp.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() for kp in views)  # no copy


# ---------------------------------------------------------------------------------------------- the model


@pytest.mark.parametrize("page", [1, 4, 16])
def test_several_chunks_over_a_fragmented_prefix_equal_a_full_recompute(tiny_variant: RandomModel, page: int) -> None:
    cfg = tiny_variant.config
    model = LlamaModel(cfg, tiny_variant.weights)
    n = 121  # not a multiple of any page size but 1: every chunk after the first starts mid-page
    ids = tokens(n, cfg.vocab_size, seed=page)
    pool = model.new_pool(400 // page + 64, page)
    table = fragmented(-(-n // page), pool.num_blocks, seed=page)
    cached = 45  # a cached prefix ending mid-page, then the rest in chunks of 13
    model.prefill(ids[:cached], 0, table, pool)
    got = model.prefill(ids[cached:], cached, table, pool, chunk_size=13, all_logits=True)
    want = reference_logits(cfg, tiny_variant.weights, ids)[cached:]
    assert (got - want).abs().max().item() < TOL
    last = model.prefill(ids[-1:], n - 1, table, pool)  # the engine's path (one chunk per pass) over all of it
    assert (last - want[-1]).abs().max().item() < TOL


def test_in_place_equals_the_masked_path_that_gathers(tiny_variant: RandomModel, monkeypatch) -> None:
    """The same chunks through the off-CPU path (the whole sequence gathered, one masked SDPA call)."""
    cfg = tiny_variant.config
    model = LlamaModel(cfg, tiny_variant.weights)
    page, n = 4, 150
    ids = tokens(n, cfg.vocab_size, seed=3)
    pool = model.new_pool(128, page)
    table = fragmented(-(-n // page), 128, seed=5)
    model.prefill(ids[:70], 0, table, pool)
    in_place = model.prefill(ids[70:], 70, table, pool, chunk_size=17, all_logits=True)
    monkeypatch.setattr(chunk_rows, "uses_split_prefill", lambda device: False)
    masked = model.prefill(ids[70:], 70, table, pool, chunk_size=17, all_logits=True)
    assert (in_place - masked).abs().max().item() < TOL


def test_everything_gathered_equals_read_in_place(tiny_variant: RandomModel, monkeypatch) -> None:
    """No run read in place (MAX_PREFIX_RUNS 0: the whole prefix gathered, as every chunk did before) gives the
    same logits as the plan's views."""
    cfg = tiny_variant.config
    model = LlamaModel(cfg, tiny_variant.weights)
    page, n = 16, 200
    ids = tokens(n, cfg.vocab_size, seed=4)
    pool = model.new_pool(64, page)
    table = list(range(20, 20 + -(-n // page)))  # consecutive: one view
    model.prefill(ids[:100], 0, table, pool)
    views = model.prefill(ids[100:], 100, table, pool, chunk_size=40, all_logits=True)
    monkeypatch.setattr(prefix_pages, "MAX_PREFIX_RUNS", 0)
    assert plan_prefix(table, 100, page).runs == ()
    gathered = model.prefill(ids[100:], 100, table, pool, chunk_size=40, all_logits=True)
    assert (views - gathered).abs().max().item() < TOL


@pytest.mark.parametrize("page", [1, 16])
def test_a_chunk_over_a_long_prefix_beside_running_decodes(tiny_variant: RandomModel, page: int) -> None:
    cfg = tiny_variant.config
    model = LlamaModel(cfg, tiny_variant.weights)
    dec_ids = [tokens(m, cfg.vocab_size, seed=30 + m) for m in (9, 26)]
    long_ids = tokens(301, cfg.vocab_size, seed=40)
    need = sum(-(-(len(x) + 1) // page) for x in dec_ids) + -(-len(long_ids) // page)
    pool = model.new_pool(2 * need + 16, page)
    free = fragmented(need, pool.num_blocks, seed=11)
    dec_tables, at = [], 0
    for ids in dec_ids:
        need = -(-(len(ids) + 1) // page)
        dec_tables.append(free[at : at + need])
        at += need
    long_table = free[at : at + -(-len(long_ids) // page)]
    for ids, table in zip(dec_ids, dec_tables, strict=True):
        model.prefill(ids[:-1], 0, table, pool)
    cached = 257  # mid-page at 16
    model.prefill(long_ids[:cached], 0, long_table, pool)
    meta = build_decode_meta(dec_tables, [len(x) for x in dec_ids], page, model.device)
    chunk = PrefillChunk(long_ids[cached:], cached, long_table)
    out = model.forward(pool, decode=DecodeBatch([x[-1] for x in dec_ids], meta), chunks=[chunk])
    assert out.chunks is not None and out.decode is not None
    want = reference_logits(cfg, tiny_variant.weights, long_ids)[-1]
    assert (out.chunks[0] - want).abs().max().item() < TOL
    for i, ids in enumerate(dec_ids):
        assert (out.decode[i] - reference_logits(cfg, tiny_variant.weights, ids)[-1]).abs().max().item() < TOL


# ---------------------------------------------------------------------------------------------- the engine


@pytest.mark.parametrize("page", [1, 16])
def test_engine_hits_then_chunks_give_the_tokens_of_an_engine_without_cache(tiny: RandomModel, page: int) -> None:
    """A long shared prefix (ending mid-page at 16), questions prefilled in chunks of 7 over it, one of them
    arriving while another decodes: greedy tokens equal the no-cache engine's exactly, logits within 1e-4."""
    kw = {"capacity_blocks": 4096 // page, "page_size": page, "prefill_chunk": 7}
    on, off = Engine(tiny, **kw), Engine(tiny, enable_cache=False, **kw)  # type: ignore[arg-type]
    system = tokens(203, 97, seed=1)
    prompts = [system + tokens(9 + 6 * i, 97, seed=10 + i) for i in range(4)]
    want = [off.generate(p, 8, return_logits=True, ignore_eos=True) for p in prompts]
    first = on.generate(prompts[0], 8, return_logits=True, ignore_eos=True)
    running = on.submit(prompts[1], max_new_tokens=24, ignore_eos=True, return_logits=True)
    late = [on.submit(p, max_new_tokens=8, ignore_eos=True, return_logits=True) for p in prompts[2:]]
    got = [first, *(h.result(60) for h in late)]
    long_run = running.result(60)
    for a, b in zip(got, [want[0], *want[2:]], strict=True):
        assert a.token_ids == b.token_ids
        assert (a.logits - b.logits).abs().max().item() < TOL
    assert long_run.token_ids[:8] == want[1].token_ids
    assert all(r.cached_tokens == (203 // page) * page for r in got[1:])
    on.cache.check_invariants()
