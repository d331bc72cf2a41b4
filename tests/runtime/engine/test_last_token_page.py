"""A prompt whose every page is cached computes its last token only (kv.manager, "The last token").

The last token's page is the tree's: admission copies it into a block of the request's own, the pass overwrites the
last position there, and the tree's page is never written. Checked against an engine without cache (greedy tokens
exactly, logits within 1e-4), with the repeat arriving while the first request decodes, from the host tier, when
the copy raises, and at the manager without a copier (the page is computed again, as before).
"""

from __future__ import annotations

import threading

import pytest
import torch

from radixcache import RadixCache
from radixcache.runtime import Engine, GenerationResult
from radixcache.runtime.engine.scheduler import SchedulerConfig
from radixcache.runtime.kv.manager import KVManager
from radixcache.runtime.kv.state import KVState, Status
from radixcache.runtime.testing import RandomModel

TOL = 1e-4
PAGE = 16


def ids(n: int, seed: int, vocab: int = 97) -> list[int]:
    return torch.randint(1, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_same(a: GenerationResult, b: GenerationResult) -> None:
    assert a.token_ids == b.token_ids
    assert (a.logits - b.logits).abs().max().item() < TOL


def all_back(engine: Engine) -> bool:
    cache = engine.cache
    return cache.free_blocks + cache.evictable_blocks == cache.capacity_blocks


def test_a_repeat_arriving_while_the_first_decodes_computes_one_token(tiny: RandomModel) -> None:
    prompt = ids(3 * PAGE, seed=1)
    with Engine(tiny, enable_cache=False, capacity_blocks=256, page_size=PAGE) as off:
        want = off.generate(prompt, 24, return_logits=True, ignore_eos=True)
    with Engine(tiny, capacity_blocks=256, page_size=PAGE) as on:
        first = on.submit(prompt, 24, return_logits=True, ignore_eos=True)
        tick = threading.Event()
        while not on.scheduler.decoding and not first.done():  # its pages are committed once it decodes
            tick.wait(0.001)
        again = on.submit(prompt, 24, return_logits=True, ignore_eos=True).result(60)
        a = first.result(60)
        assert_same(a, want)
        assert_same(again, want)
        assert again.cached_tokens == len(prompt) - 1 and again.prefill_tokens == 1
        on.check()
        on.cache.check_invariants()
        assert all_back(on)  # the private copy went back as a duplicate of the tree's page


def test_a_prompt_whose_last_page_comes_from_the_host_tier(tiny: RandomModel) -> None:
    prompt = ids(3 * PAGE, seed=2)
    fillers = [ids(5 * PAGE, seed=10 + i) for i in range(3)]
    kw = {"capacity_blocks": 8, "page_size": PAGE}
    host = 64 * PAGE * tiny.config.kv_bytes_per_token(4)
    with Engine(tiny, enable_cache=False, **kw) as off:
        want = off.generate(prompt, 4, return_logits=True, ignore_eos=True)
    with Engine(tiny, host_kv_memory=host, load_back="always", **kw) as on:
        on.generate(prompt, 4, ignore_eos=True)
        for f in fillers:  # the prompt's pages leave the device for the host
            on.generate(f, 4, ignore_eos=True)
        before = on.stats.tiers
        got = on.generate(prompt, 4, return_logits=True, ignore_eos=True)
        after = on.stats.tiers
        assert_same(got, want)
        assert got.cached_tokens == len(prompt) - 1
        assert after.host_loaded_pages > before.host_loaded_pages
        hits = sum(getattr(after, k) - getattr(before, k) for k in ("device_hit_tokens", "host_hit_tokens"))
        assert hits == len(prompt) - 1  # the cut of the last token is counted once, not as a hit
        on.check()
        on.cache.check_invariants()


def test_a_failed_page_copy_fails_that_request_alone(tiny: RandomModel) -> None:
    prompt = ids(2 * PAGE, seed=3)
    other = ids(20, seed=4)
    with Engine(tiny, enable_cache=False, capacity_blocks=256, page_size=PAGE) as off:
        want = off.generate(prompt, 6, return_logits=True, ignore_eos=True)
        want_other = off.generate(other, 30, return_logits=True, ignore_eos=True)
    with Engine(tiny, capacity_blocks=256, page_size=PAGE) as on:
        on.generate(prompt, 6, ignore_eos=True)
        real = on.kv.copy_page

        def broken(src: int, dst: int) -> None:
            raise OSError(f"copy of block {src} into {dst} failed")

        on.kv.copy_page = broken
        running = on.submit(other, 30, return_logits=True, ignore_eos=True)
        with pytest.raises(OSError, match="copy of block"):
            on.generate(prompt, 6, ignore_eos=True)
        assert_same(running.result(60), want_other)  # the decode beside it went on
        on.check()
        on.cache.check_invariants()
        assert all_back(on)
        on.kv.copy_page = real
        again = on.generate(prompt, 6, return_logits=True, ignore_eos=True)
        assert_same(again, want)
        assert again.cached_tokens == len(prompt) - 1


@pytest.mark.parametrize("copier", [True, False])
def test_the_manager_copies_the_last_tokens_page_or_gives_it_up(copier: bool) -> None:
    cache = RadixCache(16, 4)
    tokens = list(range(1, 13))  # 3 pages of 4
    blocks = cache.allocate(3)
    cache.insert(tokens, blocks)
    copies: list[tuple[int, int]] = []
    kv_manager = KVManager(cache, copy_page=(lambda s, d: copies.append((s, d))) if copier else None)
    kv = KVState(rid=1, prompt_tokens=12, max_new_tokens=4)
    assert kv_manager.admit(kv, tokens, 12)
    assert kv.status is Status.RUNNING and kv.tree_blocks == 2
    assert kv.block_table[:2] == list(blocks[:2])
    if copier:
        assert kv.num_kv == 11 and copies == [(blocks[2], kv.block_table[2])]
        assert kv.block_table[2] != blocks[2]  # a block of the request's own: the tree's page is never written
    else:
        assert kv.num_kv == 8 and not copies  # the page is computed again
    assert kv.held_blocks == kv.block_table[2:]
    cache.check_invariants()
    kv_manager.abort(kv)
    cache.check_invariants()
    assert cache.free_blocks + cache.evictable_blocks == cache.capacity_blocks
    assert cache.match_prefix(tokens).length == 12  # the tree kept its pages


def test_a_resumed_request_whose_every_token_is_cached_at_pages_of_one_token() -> None:
    """A preempted request resumes up to all but its last token (`end` = `cap`): at pages of 1 token the tree's copy
    of that last token is a page it does not need, and no block is left to copy it into (was an IndexError that
    failed the request)."""
    cache = RadixCache(16, 1)
    tokens = list(range(1, 13))  # its prompt and output so far, every position in the tree (a sharer was ahead)
    blocks = cache.allocate(12)
    cache.insert(tokens, blocks)
    copies: list[tuple[int, int]] = []
    kv_manager = KVManager(cache, copy_page=lambda s, d: copies.append((s, d)))
    kv = KVState(rid=1, prompt_tokens=8, max_new_tokens=8)
    kv.preemptions = 1
    assert kv_manager.admit(kv, tokens, len(tokens) - 1)
    assert kv.status is Status.RUNNING and kv.num_kv == 11 and not copies
    assert kv.block_table == list(blocks[:11]) and not kv.held_blocks
    kv_manager.abort(kv)
    cache.check_invariants()
    assert cache.free_blocks + cache.evictable_blocks == cache.capacity_blocks


def test_a_resumed_requests_uncopied_last_page_is_not_kept_locked() -> None:
    """The tree's page of a resumed request's last token is not needed (its decode computes that position): the
    request's lock leaves it, so that it may be evicted for the request's next page in a full pool (it was kept
    locked, and a request alone in a pool it fit ended with "length" one page early)."""
    cache = RadixCache(12, 1)
    tokens = list(range(1, 13))  # every position in the tree (a sharer was ahead), the pool full of them
    cache.insert(tokens, cache.allocate(12))
    kv_manager = KVManager(cache, copy_page=lambda s, d: None)
    kv = KVState(rid=1, prompt_tokens=8, max_new_tokens=8)
    kv.preemptions = 1
    assert kv_manager.admit(kv, tokens, len(tokens) - 1)
    assert cache.locked_blocks == 11 and cache.evictable_blocks == 1
    kv_manager.reserve(kv, 12)  # its next position: the last token's page is evicted for it
    assert len(kv.block_table) == 12
    cache.check_invariants()
    kv_manager.release(kv, tokens, 4)
    cache.check_invariants()
    assert cache.free_blocks + cache.evictable_blocks == cache.capacity_blocks


@pytest.mark.parametrize("page", [1, 4])
def test_a_prompt_that_fills_the_pool_runs_again_once_cached(tiny: RandomModel, page: int) -> None:
    """A prompt of exactly the whole pool, cached by its first run: its repeat gives up the copy of its last page
    (no block is left to copy it into beside the locked pages) and computes that page again, with the uncached
    output (it was refused with CacheFullError "beside pinned blocks", with no pin in the pool)."""
    prompt = ids(10 * page, seed=9)
    with Engine(tiny, enable_cache=False, capacity_blocks=10, page_size=page) as off:
        want = off.generate(prompt, 1, return_logits=True, ignore_eos=True)
    with Engine(tiny, capacity_blocks=10, page_size=page) as on:
        for _ in range(2):
            got = on.generate(prompt, 1, return_logits=True, ignore_eos=True)
            assert_same(got, want)
        assert got.cached_tokens == 9 * page
        on.cache.check_invariants()
        assert all_back(on)


@pytest.mark.parametrize(("page", "length"), [(1, 1), (1, 2), (4, 4), (4, 5)])
def test_short_prompts_repeated_give_the_uncached_outputs(tiny: RandomModel, page: int, length: int) -> None:
    """The edges: a one-token prompt (nothing may count as cached, its page is copied and written whole), a prompt of
    exactly one page, one token past it."""
    prompt = ids(length, seed=20 + length)
    with Engine(tiny, enable_cache=False, capacity_blocks=64, page_size=page) as off:
        want = off.generate(prompt, 5, return_logits=True, ignore_eos=True)
    with Engine(tiny, capacity_blocks=64, page_size=page) as on:
        for _ in range(3):
            got = on.generate(prompt, 5, return_logits=True, ignore_eos=True)
            assert_same(got, want)
        assert got.cached_tokens == (length - 1 if length % page == 0 else (length - 1) // page * page)
        on.cache.check_invariants()
        assert all_back(on)


@pytest.mark.parametrize("after_tokens", [0, 1, 3])
def test_a_repeat_cancelled_at_any_instant_gives_its_copy_back(tiny: RandomModel, after_tokens: int) -> None:
    """A repeat holding the private copy of the cached last page is cancelled before its pass, right after its first
    token, or mid-decode, while another request decodes: every block comes back and the tree's page is intact."""
    prompt = ids(3 * PAGE, seed=5)
    with Engine(tiny, enable_cache=False, capacity_blocks=256, page_size=PAGE) as off:
        want = off.generate(prompt, 8, return_logits=True, ignore_eos=True)
    with Engine(tiny, capacity_blocks=256, page_size=PAGE) as on:
        on.generate(prompt, 8, ignore_eos=True)
        other = on.submit(ids(30, seed=6), 40, ignore_eos=True)
        handle = on.submit(prompt, 40, ignore_eos=True)
        tick = threading.Event()
        if after_tokens:
            while not handle.done() and not any(  # the repeat (48 prompt tokens, the other has 30) has made them
                len(r.prompt_ids) == len(prompt) and len(r.output_ids) >= after_tokens
                for r in list(on.scheduler.decoding)
            ):
                tick.wait(0.001)
        handle.cancel()
        got = handle.result(60)
        assert got.finish_reason in ("cancelled", "length")
        other.result(60)
        on.check()
        on.cache.check_invariants()
        assert all_back(on)
        again = on.generate(prompt, 8, return_logits=True, ignore_eos=True)
        assert_same(again, want)


@pytest.mark.parametrize("share", [True, False])
def test_a_repeat_in_a_nearly_full_pool_makes_every_token_once_its_page_is_copied(
    tiny: RandomModel, share: bool
) -> None:
    """A prompt of two whole pages, then 8 tokens, in a pool of three pages: its repeat copies the cached last page
    into its own block, and the tree's page leaves its lock, so it can be evicted for the repeat's third page. Kept
    locked (for the request's life without in-flight sharing), the repeat ended with "length" after 1 token."""
    prompt = ids(2 * PAGE, seed=3)
    with Engine(tiny, enable_cache=False, capacity_blocks=64, page_size=PAGE) as off:
        want = off.generate(prompt, 8, return_logits=True, ignore_eos=True)
    config = SchedulerConfig(share_in_flight=share)
    with Engine(tiny, capacity_blocks=3, page_size=PAGE, scheduler_config=config) as on:
        for _ in range(2):
            got = on.generate(prompt, 8, return_logits=True, ignore_eos=True)
            assert_same(got, want)
        assert got.cached_tokens == len(prompt) - 1 and got.prefill_tokens == 1  # the copy was made
        on.cache.check_invariants()
        assert all_back(on)


def test_the_manager_keeps_no_lock_on_the_page_it_copied() -> None:
    cache = RadixCache(16, 4)
    tokens = list(range(1, 13))  # 3 pages of 4
    cache.insert(tokens, cache.allocate(3))
    kv_manager = KVManager(cache, copy_page=lambda s, d: None)
    kv = KVState(rid=1, prompt_tokens=12, max_new_tokens=4)
    assert kv_manager.admit(kv, tokens, 12)
    assert kv.tree_blocks == 2 and cache.held_blocks == 1  # the copy
    assert cache.evictable_blocks == 1  # the page it copied
    assert kv.match_node is not None and kv.match_node.end_len == 8
    cache.check_invariants()
    kv_manager.abort(kv)
    assert cache.locked_blocks == 0 and cache.free_blocks + cache.evictable_blocks == cache.capacity_blocks
