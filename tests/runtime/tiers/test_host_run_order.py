"""The host tier's order of use for runs that arrive over many commits (PageTier.store's `older_than`): each new page
goes just older than the run's page before it, so a run's head stays last to go at the tier's limit without the run
being refreshed at each page a request adds (that was O(run) per commit, quadratic in a long decode: about 0.3 ms a
decode page at 2,000 pages)."""

from __future__ import annotations

import asyncio
import random

import pytest

from radixcache import RadixCache
from radixcache.runtime import Engine
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from radixcache.tier import page_tier
from radixcache.tier.page_tier import PageTier
from radixcache.tier.tiered_cache import TieredCache
from tests.runtime.conftest import h

P = 4


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=5)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def test_a_long_decode_costs_the_host_tier_a_bounded_work_per_page(
    model: RandomModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each commit (each decode page) refreshed the request's whole run in the host tier: k pages moved at its k-th
    page. Now a page costs its own store; the run is refreshed when used (its admission)."""
    touched: list[int] = []
    real_touch = page_tier.PageTier.touch
    monkeypatch.setattr(
        page_tier.PageTier, "touch", lambda self, hashes: (touched.append(len(hashes)), real_touch(self, hashes))[1]
    )
    rng = random.Random(13)
    prompt = [rng.randrange(1, model.config.vocab_size) for _ in range(2 * P)]
    pages = 2 + 60
    host_bytes = 400 * P * model.config.kv_bytes_per_token(4)
    with Engine(model, capacity_blocks=400, page_size=P, host_kv_memory=host_bytes) as engine:
        result = engine.generate(prompt, 60 * P + 1, ignore_eos=True)  # 60 output pages, adopted one commit each
        host = engine.tiers.host
        assert host is not None and host.stats.stored == pages
        assert sum(touched) <= 2 * pages  # was about pages**2 / 2
        host.settle()
        run = engine.tiers.chain(None).upto([*prompt, *result.token_ids], pages)
        assert list(host._lru) == run[::-1]  # the head newest, each page just older than the one before it


class Naive:
    """The order of use as a plain list, least recent first, of a tier holding `limit` pages: a run's new page goes just
    before (older than) the page before it in its run; not at all when that one is absent, or is the oldest of a full
    tier; a run used moves to the end with its head last; a full tier drops from the front."""

    def __init__(self, limit: int) -> None:
        self.limit, self.order = limit, list[bytes]()

    def put(self, page: bytes, parent: bytes | None) -> bool:
        if page in self.order:
            if parent is not None and parent not in self.order:
                return False  # after a gap: unreadable, and so are the pages after it
            if parent is None:
                self.order.remove(page)
                self.order.append(page)
            else:
                self.order.remove(page)
                self.order.insert(self.order.index(parent), page)
            return True
        if parent is not None and (
            parent not in self.order or (len(self.order) == self.limit and self.order[0] == parent)
        ):
            return False
        if len(self.order) == self.limit:
            self.order.pop(0)
        self.order.insert(self.order.index(parent) if parent is not None else len(self.order), page)
        return True

    def refresh(self, run: list[bytes]) -> None:
        held = [p for p in run if p in self.order]
        self.order = [p for p in self.order if p not in held] + held[::-1]


@pytest.mark.parametrize("seed", range(6))
def test_the_order_at_the_host_tiers_limit_matches_a_naive_reference(seed: int) -> None:
    """Runs growing a few pages at a time (a commit: head first, each page after the one before it, as
    TieredCache.adopted stores them), and uses of their prefixes (an admission's refresh, a lookup), in a tier of 8
    pages: the pages kept and their order are the plain list's."""
    tier, naive = PageTier(8), Naive(8)
    rng = random.Random(seed)
    runs = [[h(1000 * r + i) for i in range(12)] for r in range(12)]
    grown = [0] * len(runs)
    refused = 0
    for _ in range(200):
        r = rng.randrange(len(runs))
        run, op = runs[r], rng.random()
        if op < 0.5 and grown[r] < len(run):  # a commit adds 1 to 3 pages
            end = min(len(run), grown[r] + rng.randint(1, 3))
            for i in range(grown[r], end):
                parent = run[i - 1] if i else None
                stored = tier.store(run[i], parent) is not None
                assert stored == naive.put(run[i], parent)
                refused += not stored
            grown[r] = end
        elif op < 0.8 and grown[r]:  # an admission that used a prefix of it
            used = run[: rng.randint(1, grown[r])]
            tier.touch(used)
            naive.refresh(used)
        elif grown[r]:  # a lookup: refreshes what it finds, from the head
            found = tier.count_prefix(run[: grown[r]])
            naive.refresh(run[:found])
        assert list(tier._lru) == naive.order
        tier.check_invariants()
    assert refused and tier.stats.evicted  # the limit took pages, and a page was refused


def test_a_commit_stops_at_a_gap_even_where_the_tier_holds_the_page_after_it() -> None:
    """Run a, b, c stored, then a evicted (b and c are unreadable: a lookup stops at a). A request that recomputed
    the run commits b, c, d after a (which is on its device, not in the host): b and c were refreshed and d copied
    in, a page past the gap that no lookup can reach, taking a slot a readable page could have had."""
    tier, copied = PageTier(8), list[list[int]]()
    tiered = TieredCache(RadixCache(16, P), host=tier, copy_to_host=lambda blocks, slots: copied.append(blocks))
    a, b, c, d = (h(i) for i in range(4))
    tiered.adopted([a, b, c], [0, 1, 2], list(range(3 * P)))
    assert tier.discard(a)  # evicted, or its copy failed
    tiered.adopted([b, c, d], [5, 6, 7], list(range(P, 4 * P)), parent=a)
    assert copied == [[0, 1, 2]] and d not in tier  # d was copied past the gap
    assert tier.count_prefix([a, b, c, d]) == 0
    tier.check_invariants()


@pytest.mark.parametrize("seed", range(6))
def test_recommitted_spans_after_a_gap_match_the_naive_reference(seed: int) -> None:
    """Commits of spans the tier may partly hold already (another request's pages over a prefix that was evicted in
    part), head first as TieredCache.adopted stores them, stopping at the first refused page: the pages kept and
    their order are the plain list's, and no page the tier holds follows a gap in its run, unless its parent is
    one stored before the parent was evicted."""
    tier, naive = PageTier(10), Naive(10)
    rng = random.Random(100 + seed)
    runs = [[h(1000 * r + i) for i in range(10)] for r in range(6)]
    refused = 0
    for _ in range(300):
        run = runs[rng.randrange(len(runs))]
        if rng.random() < 0.7:  # a commit of run[i:j] after run[i - 1]
            i = rng.randrange(len(run))
            for k in range(i, min(len(run), i + rng.randint(1, 4))):
                parent = run[k - 1] if k else None
                stored = tier.store(run[k], parent) is not None
                assert stored == naive.put(run[k], parent)
                if not stored:
                    refused += 1
                    break
        else:  # a lookup from the head, or a page dropped (a failed copy)
            found = tier.count_prefix(run)
            naive.refresh(run[:found])
            victim = rng.choice(run)
            if rng.random() < 0.3 and victim in tier:
                tier.discard(victim)
                naive.order.remove(victim)
        assert list(tier._lru) == naive.order
        tier.check_invariants()
    assert refused


def test_a_request_that_finishes_is_the_newest_run_in_both_tiers(model: RandomModel, tmp_path) -> None:
    """A run's pages are placed by its last use: a long generation's output pages went just older than its prompt,
    stamped at its admission, so a request admitted while it decoded was newer in both tiers, and a tier busy with
    such pages evicted the long generation's as they were written. A request uses its run until it finishes: its run
    is then the most recently used (the LRU order of uses: A admitted, B admitted and finished, A finished)."""
    rng = random.Random(21)
    vocab = model.config.vocab_size
    long_prompt, short_prompt = ([rng.randrange(1, vocab) for _ in range(3 * P)] for _ in range(2))
    host_bytes = 400 * P * model.config.kv_bytes_per_token(4)
    kwargs = {"capacity_blocks": 400, "page_size": P, "host_kv_memory": host_bytes, "cache_dir": tmp_path}
    with Engine(model, **kwargs) as engine:
        stream = engine.stream(long_prompt, 100 * P, ignore_eos=True)

        async def interleave() -> tuple:
            first = await stream.__anext__()  # the long request is admitted and decoding
            short = await asyncio.to_thread(engine.generate, short_prompt, 2)  # admitted after it, finished before
            return first, short, [delta async for delta in stream]

        first, short, rest = asyncio.run(interleave())
        assert first and rest, "the long request was still decoding when the short one finished"
        long_ids = [*long_prompt, *stream.result.token_ids]
        assert len(stream.result.token_ids) == 100 * P
        assert engine.flush(30)
        chain = engine.tiers.chain(None)
        a = chain.upto(long_ids, (len(long_ids) - 1) // P)  # the last token has no KV
        b = engine.tiers.chain(None).upto([*short_prompt, *short.token_ids], 3)
        host = engine.tiers.host
        host.settle()
        order = list(host._lru)
        assert order[-1] == a[0] and all(order.index(x) < order.index(y) for x in b for y in a)
        disk = engine.tiers.disk._index.order()
        assert disk[-1] == a[0] and all(disk.index(x) < disk.index(y) for x in b for y in a)


def test_a_cancelled_request_is_the_newest_run_in_both_tiers(model: RandomModel, tmp_path) -> None:
    """A cancel ends a request's use of its run as its end does: a stream stopped mid-decode (a user's stop, an agent
    that read enough) left its pages placed by its admission, older than a request admitted and finished meanwhile."""
    rng = random.Random(22)
    vocab = model.config.vocab_size
    long_prompt, short_prompt = ([rng.randrange(1, vocab) for _ in range(3 * P)] for _ in range(2))
    host_bytes = 400 * P * model.config.kv_bytes_per_token(4)
    kwargs = {"capacity_blocks": 400, "page_size": P, "host_kv_memory": host_bytes, "cache_dir": tmp_path}
    with Engine(model, **kwargs) as engine:
        handle = engine.submit(long_prompt, 300 * P, ignore_eos=True)
        short = engine.generate(short_prompt, 2)  # admitted with or after it, finished before it
        handle.cancel()
        result = handle.result(30)
        assert result.finish_reason == "cancelled", "the long request was still decoding when it was cancelled"
        assert engine.flush(30)
        b = engine.tiers.chain(None).upto([*short_prompt, *short.token_ids], 3)
        a = engine.tiers.chain(None).upto(long_prompt, 3)
        host = engine.tiers.host
        host.settle()
        order = list(host._lru)
        assert order[-1] == a[0] and all(order.index(x) < order.index(y) for x in b for y in a)
        disk = engine.tiers.disk._index.order()
        assert disk[-1] == a[0] and all(disk.index(x) < disk.index(y) for x in b for y in a)


def test_a_request_cancelled_before_its_first_new_page_is_the_newest_run_in_both_tiers(
    model: RandomModel, tmp_path
) -> None:
    """A cancel refreshed only the pages whose hashes its chain held: a prompt the device holds whole is not hashed
    at admission (the refresh is deferred), and its commits add no page before the decode fills one, so a request
    cancelled then refreshed nothing, and its run stayed older than a request admitted and finished meanwhile,
    where a finished one is refreshed whole (A admitted, C admitted and finished, A cancelled)."""
    rng = random.Random(23)
    vocab = model.config.vocab_size
    prompt, other = ([rng.randrange(1, vocab) for _ in range(3 * P)] for _ in range(2))
    host_bytes = 400 * P * model.config.kv_bytes_per_token(4)
    kwargs = {"capacity_blocks": 400, "page_size": P, "host_kv_memory": host_bytes, "cache_dir": tmp_path}
    with Engine(model, **kwargs) as engine:
        engine.generate(prompt, 1)  # the device holds the whole prompt now
        assert engine._loop.wait_idle(30)
        a = engine._request(prompt, 10 * P, ignore_eos=True)
        engine.scheduler.add(a)
        engine.scheduler.step()  # admitted, its last token computed
        c = engine._request(other, 2, ignore_eos=True)
        engine.scheduler.add(c)
        for _ in range(20):
            if c.finish_reason is not None:
                break
            engine.scheduler.step()
        assert c.finish_reason is not None and a in engine.scheduler.decoding and len(a.output_ids) < P
        assert engine.scheduler.abort(a) and a.finish_reason == "cancelled"
        assert engine.flush(30)
        run = engine.tiers.chain(None).upto(prompt, 3)
        others = engine.tiers.chain(None).upto([*other, *c.output_ids], (len(other) + 1) // P)
        host = engine.tiers.host
        host.settle()
        for order in (list(host._lru), engine.tiers.disk._index.order()):
            assert order[-len(run) :] == run[::-1]  # the cancelled run is the newest, its head last
            assert all(order.index(x) < order.index(run[-1]) for x in others)
