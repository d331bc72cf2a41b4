"""Admission control in the engine (radixcache.policy.admission via kv.manager): pages past a request's admission limit
never reach the tree, are freed when it leaves, and change no output; `retain="conversation"` keeps every page of
a turn for the next one; requests arriving mid-prefill or mid-decode, preemption and aborts keep the pool whole."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from radixcache.page_hash import chain_hashes, root_hash
from radixcache.policy.admission import AdmissionPolicy, AdmissionRequest, AdmitAll
from radixcache.router import RouterIndex
from radixcache.runtime import Engine
from radixcache.runtime.engine.scheduler import SchedulerConfig
from radixcache.runtime.testing import RandomModel

P = 4  # page size of these tests
TOL = 1e-4


class DeclineAll(AdmissionPolicy):
    """Adopts nothing past what a request found cached; records what it was asked."""

    name = "decline"

    def __init__(self) -> None:
        self.asked: list[AdmissionRequest] = []

    def decide(self, request: AdmissionRequest) -> int:
        self.asked.append(request)
        return 0


class AdmitPages(AdmissionPolicy):
    """Adopts the first `pages` pages (or the prompt's whole pages when `pages` is None)."""

    name = "pages"

    def __init__(self, pages: int | None = None) -> None:
        self.pages = pages
        self.asked: list[AdmissionRequest] = []

    def decide(self, request: AdmissionRequest) -> int:
        self.asked.append(request)
        return request.prompt_pages if self.pages is None else self.pages


class RandomAdmission(AdmissionPolicy):
    """Any answer at all, seeded (admit clamps it to [cached, total])."""

    name = "random"

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def decide(self, request: AdmissionRequest) -> int:
        return self.rng.randint(-2, request.total_pages + 2)


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def step(engine: Engine) -> None:
    with torch.inference_mode():
        engine.scheduler.step()
    check_pool(engine)


def run_all(engine: Engine) -> None:
    while engine.scheduler.has_work():
        step(engine)
    engine.scheduler.drain()


def check_pool(engine: Engine) -> None:
    """Invariants, and every held block is in some running request's block table past its tree pages."""
    c = engine.cache
    c.check_invariants()
    assert c.held_blocks == sum(len(r.kv.held_blocks) for r in engine.scheduler.running)
    assert c.free_blocks + c.evictable_blocks + c.locked_blocks == c.capacity_blocks


def assert_clean(engine: Engine) -> None:
    gauges = engine.check()
    assert gauges["held_blocks"] == 0 and gauges["locked_blocks"] == gauges["pinned_blocks"]
    assert gauges["free_blocks"] + gauges["evictable_blocks"] + gauges["locked_blocks"] == gauges["capacity_blocks"]
    assert gauges["running"] == gauges["waiting"] == 0


_UNCACHED: dict[tuple, list] = {}


def uncached(model: RandomModel, prompts: list[list[int]], max_new: int) -> list:
    """The requests run one by one on an engine without the cache (kept for the module's other tests)."""
    key = (id(model), tuple(map(tuple, prompts)), max_new)
    if key not in _UNCACHED:
        engine = Engine(model, capacity_blocks=256, page_size=P, enable_cache=False)
        _UNCACHED[key] = [engine.generate(p, max_new, ignore_eos=True, return_logits=True) for p in prompts]
    return _UNCACHED[key]


def assert_same(got: list, want: list) -> None:
    for g, w in zip(got, want, strict=True):
        tokens = tuple(g.output_ids) if hasattr(g, "output_ids") else g.token_ids
        logits = torch.stack(g.logits) if isinstance(g.logits, list) else g.logits
        assert tokens == w.token_ids
        assert (logits - w.logits).abs().max().item() < TOL


def tree_pages(engine: Engine) -> int:
    return engine.cache.capacity_blocks - engine.cache.free_blocks - engine.cache.locked_blocks


# ---------------------------------------------------------------------------------------------- the basics


def test_a_declining_policy_changes_no_output_and_frees_every_declined_page(tiny: RandomModel) -> None:
    system = ids(18, 1)
    prompts = [[*system, *ids(3 + i, 10 + i)] for i in range(4)] + [ids(9, 20)]
    want = uncached(tiny, prompts, 7)
    policy = DeclineAll()
    engine = Engine(tiny, capacity_blocks=64, page_size=P, admission=policy)
    got = [engine.generate(p, 7, ignore_eos=True, return_logits=True) for p in prompts]
    assert_same(got, want)
    assert all(g.cached_tokens == 0 for g in got), "nothing was adopted, so nothing is hit"
    assert engine.cache.evictable_blocks == 0 and engine.cache.free_blocks == 64
    declined = sum((len(p) + 7 - 1) // P for p in prompts)  # every computed full page (the last token has no K/V)
    assert engine.stats.admission_declined_pages == declined == engine.kv.declined_pages
    assert len(policy.asked) == len(prompts), "asked once per request"
    assert_clean(engine)


def test_the_next_identical_prompt_hits_only_the_pages_admitted(tiny: RandomModel) -> None:
    prompt = ids(22, 2)  # 5 whole pages and a tail
    for admitted in (0, 2, 4):
        policy = AdmitPages(admitted)
        engine = Engine(tiny, capacity_blocks=64, page_size=P, admission=policy)
        first = engine.generate(prompt, 6, ignore_eos=True)
        again = engine.generate(prompt, 6, ignore_eos=True)
        assert first.cached_tokens == 0
        assert again.cached_tokens == admitted * P
        assert again.token_ids == first.token_ids
        ask = policy.asked[0]
        assert (ask.cached_pages, ask.prompt_pages, ask.total_pages) == (0, 5, (22 + 6 - 1) // P)
        assert ask.namespace is None and ask.retain is None and ask.timestamp is not None
        assert policy.asked[1].cached_pages == admitted, "the second request found what the first left"
        assert tree_pages(engine) == admitted, "the tree holds exactly the admitted pages"
        assert_clean(engine)


def test_admit_all_is_the_default_and_changes_nothing(tiny: RandomModel) -> None:
    system = ids(20, 3)
    prompts = [[*system, *ids(4, 30 + i)] for i in range(3)]
    runs = []
    for admission in (None, "all", AdmitAll()):
        chosen = {} if admission is None else {"admission": admission}
        engine = Engine(tiny, capacity_blocks=64, page_size=P, **chosen)
        assert isinstance(engine.admission, AdmitAll)
        handles = engine.submit(prompts, 9, ignore_eos=True)
        out = [h.result(timeout=60) for h in handles]
        out.append(engine.generate([*prompts[0], *out[0].token_ids, 5], 3))
        runs.append([(r.token_ids, r.cached_tokens) for r in out])
        assert engine.stats.admission_declined_pages == 0
        assert_clean(engine)
    assert runs[0] == runs[1] == runs[2]


def test_a_bad_admission_or_retain_is_refused_before_anything_is_queued(tiny: RandomModel) -> None:
    with pytest.raises(ValueError, match="admission"):
        Engine(tiny, capacity_blocks=16, page_size=P, admission="belady-ish")
    engine = Engine(tiny, capacity_blocks=16, page_size=P)
    for call in (
        lambda: engine.generate(ids(5, 4), 2, retain="forever"),
        lambda: engine.submit([ids(5, 4), ids(6, 5)], 2, retain="Conversation"),
        lambda: engine.submit_group([ids(5, 4)] * 2, 2, retain=1),
    ):
        with pytest.raises(ValueError, match="retain"):
            call()
    assert engine.queue.waiting == 0 and not engine.scheduler.has_work()
    assert engine.generate(ids(5, 4), 2, retain="conversation").token_ids  # the one hint is fine
    assert_clean(engine)


def test_the_learned_admission_learns_from_the_engines_own_eviction_policy(tiny: RandomModel) -> None:
    with pytest.raises(ValueError, match="reuse"):
        Engine(tiny, capacity_blocks=16, page_size=P, admission="reuse")  # the default eviction policy is lru
    system = ids(20, 5)
    prompts = [[*system, *ids(3 + i % 4, 80 + i)] for i in range(8)]
    want = uncached(tiny, prompts, 6)
    engine = Engine(tiny, capacity_blocks=40, page_size=P, policy="reuse", admission="reuse")
    assert engine.admission.name == "reuse" and engine.admission.model is engine.retention.base
    got = [engine.generate(p, 6, ignore_eos=True, return_logits=True) for p in prompts]
    assert_same(got, want)
    assert_clean(engine)
    model = engine.retention.base
    assert model.mean_rate() > 0  # the shared system prompt's hits reached the policy through the wrapper
    # Pages committed in flight (every whole page here) go in before the output's length is known: bucket -1; a
    # hint given at a give-back that inserts nothing new is not left over for another request's pages.
    assert {group[0][0][2] for group in model._groups.values()} == {-1} and model._expected == -1


class Broken(AdmissionPolicy):
    name = "broken"

    def decide(self, request: AdmissionRequest) -> int:
        raise ZeroDivisionError("a bug in a user's policy")


def test_a_policy_that_raises_fails_no_request_and_adopts_every_page(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=P, admission=Broken())
    prompts = [ids(13, 90), ids(17, 91)]
    want = uncached(tiny, prompts, 5)
    reqs = [engine._request(p, 5, ignore_eos=True, return_logits=True) for p in prompts]
    for r in reqs:
        engine.scheduler.add(r)
    with pytest.warns(RuntimeWarning, match="broken"):
        run_all(engine)
    assert_same(reqs, want)
    for r in reqs:
        assert engine.cache.peek(r.all_ids).length == (len(r.all_ids) - 1) // P * P
    assert engine.stats.admission_declined_pages == 0
    assert_clean(engine)


# ---------------------------------------------------------------------------------------------- retain


def test_retain_conversation_keeps_every_page_the_next_turn_reads(tiny: RandomModel) -> None:
    first_prompt = ids(17, 6)
    for retain in (None, "conversation"):
        policy = DeclineAll()
        engine = Engine(tiny, capacity_blocks=64, page_size=P, admission=policy)
        turn1 = engine.generate(first_prompt, 10, ignore_eos=True, retain=retain)
        history = [*first_prompt, *turn1.token_ids]
        turn2 = engine.generate([*history, *ids(5, 7)], 4, ignore_eos=True, retain=retain)
        if retain is None:
            assert turn2.cached_tokens == 0
        else:
            assert turn2.cached_tokens == (len(history) - 1) // P * P, "every whole page of the previous turn"
            assert not policy.asked, "the hint is applied before the policy is consulted"
            assert engine.stats.admission_declined_pages == 0
        assert_clean(engine)


def test_a_session_with_retain_hits_its_whole_history_under_a_declining_policy(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=128, page_size=P, admission=DeclineAll())
    plain = engine.session(system="be brief please.", max_new_tokens=6)
    plain.send("hello there")
    assert plain.send("and again").cached_tokens == 0, "nothing of the first turn was adopted"
    session = engine.session(system="you are terse.", max_new_tokens=6, retain="conversation")
    session.send("hello there")
    second = session.send("and again")
    tok = engine.tokenizer
    first_prompt = tok.encode(tok.apply_chat_template(session.messages[:2], add_generation_prompt=True))
    assert second.cached_tokens >= len(first_prompt) // P * P, "the first turn's prompt and reply were kept"
    assert_clean(engine)


# ---------------------------------------------------------------------------------------------- arrivals


def test_requests_arriving_mid_prefill_and_mid_decode_share_only_admitted_pages(tiny: RandomModel) -> None:
    system = ids(24, 8)
    prompts = [[*system, *ids(6, 40)], [*system, *ids(5, 41)], [*system, *ids(7, 42)]]
    want = uncached(tiny, prompts, 8)
    policy = AdmitPages()  # the prompt's whole pages: the shared system prompt is adopted, the replies are not
    engine = Engine(tiny, capacity_blocks=64, page_size=P, max_prefill_tokens=8, admission=policy)
    a, b, c = (engine._request(p, 8, ignore_eos=True, return_logits=True) for p in prompts)
    engine.scheduler.add(a)
    step(engine)
    step(engine)  # a has computed 16 of its 30 prompt tokens
    engine.scheduler.add(b)
    while a not in engine.scheduler.decoding:
        step(engine)
    engine.scheduler.add(c)  # arrives while a decodes (b prefills or decodes)
    run_all(engine)
    assert_same([a, b, c], want)
    assert b.kv.cached_tokens == c.kv.cached_tokens == 24, "the system prompt's pages, committed by a while it ran"
    for r in (a, b, c):  # the prompt's pages stayed; no reply page did
        assert engine.cache.peek(r.all_ids).length == len(r.prompt_ids) // P * P
    assert engine.stats.admission_declined_pages == sum(
        (len(r.all_ids) - 1) // P - len(r.prompt_ids) // P for r in (a, b, c)
    )
    assert_clean(engine)


def test_a_request_does_not_wait_for_pages_its_sharer_declines(tiny: RandomModel) -> None:
    system = ids(24, 9)
    cfg = SchedulerConfig(max_prefill_tokens=16, prefill_chunk=8)
    for policy in (AdmitAll(), DeclineAll()):
        engine = Engine(tiny, capacity_blocks=64, page_size=P, scheduler_config=cfg, admission=policy)
        a = engine._request([*system, *ids(6, 50)], 4, ignore_eos=True)
        b = engine._request([*system, *ids(5, 51)], 4, ignore_eos=True)
        engine.scheduler.add(a)
        step(engine)
        engine.scheduler.add(b)
        step(engine)
        if isinstance(policy, AdmitAll):
            assert b.t_admitted is None, "b waits for the system pages a is computing"
        else:
            assert b.t_admitted is not None, "a will never commit the shared pages: b computes them at once"
        run_all(engine)
        assert b.kv.cached_tokens == (24 if isinstance(policy, AdmitAll) else 0)
        assert_clean(engine)


@pytest.mark.parametrize("seed", range(3))
def test_random_answers_with_arrivals_between_steps_match_the_requests_run_alone(tiny: RandomModel, seed: int) -> None:
    rng = random.Random(seed)
    systems = [ids(rng.randrange(8, 26), 60 + seed * 10 + g) for g in range(2)]
    prompts = [[*systems[i % 2], *ids(rng.randrange(1, 9), 200 + seed * 50 + i)] for i in range(9)]
    want = uncached(tiny, prompts, 6)
    cfg = SchedulerConfig(max_prefill_tokens=12, mixed_prefill_tokens=6, prefill_chunk=8)
    engine = Engine(tiny, capacity_blocks=48, page_size=P, scheduler_config=cfg, admission=RandomAdmission(seed))
    reqs = [engine._request(p, 6, ignore_eos=True, return_logits=True) for p in prompts]
    pending = list(reqs)
    while pending or engine.scheduler.has_work():
        for _ in range(rng.randrange(0, 3)):  # 0 to 2 arrivals before each step
            if pending:
                engine.scheduler.add(pending.pop(0))
        step(engine)
    engine.scheduler.drain()
    assert_same(reqs, want)
    for r in reqs:
        assert r.kv.admit_limit is not None and r.kv.admit_limit >= r.kv.found_pages
    assert_clean(engine)


# ---------------------------------------------------------------------------------------------- pressure, aborts


@pytest.mark.parametrize("make_policy", [DeclineAll, AdmitPages])
def test_preemption_in_a_tiny_pool_recomputes_declined_pages_and_changes_nothing(
    tiny: RandomModel, make_policy: type
) -> None:
    prompts = [ids(20, 300 + i) for i in range(6)]
    want = uncached(tiny, prompts, 24)
    engine = Engine(tiny, capacity_blocks=30, page_size=P, admission=make_policy())
    got = engine.generate(prompts, 24, ignore_eos=True, return_logits=True)
    assert_same(got, want)
    s = engine.stats
    assert s.preemptions > 0 and s.recomputed_tokens > 0
    assert all(g.cached_tokens == 0 for g in got)
    assert s.admission_declined_pages > 0
    assert_clean(engine)


def test_preemption_step_by_step_keeps_every_block_accounted(tiny: RandomModel) -> None:
    prompts = [ids(12, 320 + i) for i in range(4)]
    want = uncached(tiny, prompts, 20)
    engine = Engine(tiny, capacity_blocks=20, page_size=P, admission=AdmitPages(2))
    reqs = [engine._request(p, 20, ignore_eos=True, return_logits=True) for p in prompts]
    engine.scheduler.add(reqs[0])
    step(engine)
    for r in reqs[1:]:  # the others arrive while the first decodes
        engine.scheduler.add(r)
        step(engine)
    run_all(engine)
    assert sum(r.kv.preemptions for r in reqs) > 0
    assert_same(reqs, want)
    assert all(r.kv.admit_limit == 2 for r in reqs), "decided once, kept across preemptions"
    assert_clean(engine)


def test_an_abort_mid_stream_keeps_committed_pages_and_frees_declined_ones(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=P, admission=AdmitPages())
    prompt = ids(21, 11)
    a = engine._request(prompt, 40, ignore_eos=True)
    engine.scheduler.add(a)
    while len(a.output_ids) < 12:
        step(engine)
    assert a.kv.admit_limit == 5 and a.kv.tree_blocks == 5 and len(a.kv.held_blocks) > 1
    engine.scheduler.abort(a)
    check_pool(engine)
    assert a.finish_reason == "cancelled" and engine.cache.held_blocks == 0
    assert engine.cache.peek(a.all_ids).length == 20, "the committed prompt pages stay; the rest was freed"
    assert tree_pages(engine) == 5
    assert_clean(engine)


async def _first_delta(engine: Engine, prompt: list[int]) -> None:
    async for _ in engine.stream(prompt, 80, ignore_eos=True):
        break  # the reader goes away mid-stream: the request is cancelled


def test_a_stream_closed_early_under_a_declining_policy_leaves_nothing_held(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=P, admission=DeclineAll())
    asyncio.run(_first_delta(engine, ids(14, 12)))
    assert engine.wait_idle(30)
    assert engine.cache.evictable_blocks == 0, "nothing was adopted"
    assert_clean(engine)


# ---------------------------------------------------------------------------------------------- tiers, events


def _tree_keys(engine: Engine) -> set[bytes]:
    keys: set[bytes] = set()
    for node in engine.cache.iter_nodes():
        path = chain_hashes(node.tokens(), P, root_hash(engine.fingerprint, node.namespace))
        keys.update(path[node.prefix_len // P :])
    return keys


def test_only_adopted_pages_reach_the_event_log_and_the_host_tier(tiny: RandomModel) -> None:
    engine = Engine(
        tiny, capacity_blocks=80, page_size=P, kv_events=True, host_kv_memory="1MiB", admission=AdmitPages()
    )
    index = RouterIndex()
    index.add_replica(0)
    system = ids(16, 13)
    prompts = [[*system, *ids(3 + i, 70 + i)] for i in range(6)]
    with engine:
        handles = engine.submit(prompts, 9, ignore_eos=True)
        results = [h.result(timeout=60) for h in handles]
        batches = engine.events.since(index.last_seq(0))
        assert batches is not None
        for batch in batches:
            assert index.apply(batch)
        keys = _tree_keys(engine)
        assert index.keys(0) == keys
        assert engine.cache.stats.evicted_blocks == 0 and engine.stats.tiers is not None
        assert engine.stats.tiers.host_saved_pages == len(keys), "the host tier got the adopted pages only"
        for p, r in zip(prompts, results, strict=True):
            assert engine.cache.peek([*p, *r.token_ids]).length <= len(p) // P * P
        assert_clean(engine)
