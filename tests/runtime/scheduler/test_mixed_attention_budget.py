"""SchedulerConfig.mixed_prefill_attention: while requests decode, a step's chunks stay within the attention work
(query tokens x positions attended) the option allows, so a chunk over a long cached prefix is cut into several
steps; the step's first chunk always gets a token; without decodes the bound does not apply; outputs equal the
no-cache engine's; a value that is not None or an int >= 1 is refused by name."""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.engine.prefill_budget import tokens_within_attention
from radixcache.runtime.engine.scheduler import SchedulerConfig
from radixcache.runtime.testing import RandomModel

from .conftest import assert_clean, ids

P = 4
TOL = 1e-4
PREFIX = 64  # cached positions the long request finds


def _work(start: int, n: int) -> int:
    """Positions attended by n queries after `start` cached ones, counted one query at a time."""
    return sum(start + i + 1 for i in range(n))


def _expected_chunks(start: int, end: int, work: int, tokens: int) -> list[int]:
    """What each step should run of a prefill from `start` to `end` beside a decode: the most tokens within the
    token budget whose work fits, at least one."""
    sizes = []
    while start < end:
        n = 1
        while n < min(end - start, tokens) and _work(start, n + 1) <= work:
            n += 1
        sizes.append(n)
        start += n
    return sizes


def _uncached(model: RandomModel, prompts: list[list[int]], max_new: int) -> list:
    engine = Engine(model, capacity_blocks=128, page_size=P, enable_cache=False)
    return [engine.generate(p, max_new, ignore_eos=True, return_logits=True) for p in prompts]


def _assert_same(got: list, want: list) -> None:
    for g, w in zip(got, want, strict=True):
        assert tuple(g.output_ids) == w.token_ids
        assert (torch.stack(g.logits) - w.logits).abs().max().item() < TOL


def _run_long_beside_a_decode(tiny: RandomModel, cfg: SchedulerConfig) -> tuple[list[int], list, list[list[int]]]:
    """Cache a PREFIX-token prompt, start a decode, then submit that prefix plus 14 new tokens: the long
    request's chunk sizes step by step (from its cached prefix), the two requests, their prompts."""
    prefix, short = ids(PREFIX, 1), ids(6, 2)
    long = [*prefix, *ids(14, 3)]
    engine = Engine(tiny, capacity_blocks=128, page_size=P, scheduler_config=cfg)
    engine.generate(prefix, 1, ignore_eos=True)
    assert engine.wait_idle(30)  # the loop thread has left: it would step what the test adds by hand
    dec = engine._request(short, 40, ignore_eos=True, return_logits=True)
    req = engine._request(long, 3, ignore_eos=True, return_logits=True)
    sched = engine.scheduler
    sched.add(dec)
    with torch.inference_mode():
        while not dec.output_ids:
            sched.step()
        sched.add(req)
        sizes, seen = [], None
        while req in sched.waiting or req in sched.prefilling:
            sched.step()
            assert dec in sched.decoding, "the decode runs beside every chunk"
            if seen is None and req.t_admitted is not None:
                seen = req.kv.cached_tokens
            if seen is not None and req.kv.num_kv > seen:
                sizes.append(req.kv.num_kv - seen)
                seen = req.kv.num_kv
        while sched.has_work():
            sched.step()
    sched.drain()
    assert req.kv.cached_tokens == PREFIX
    assert_clean(engine)
    return sizes, [dec, req], [short, long]


@pytest.mark.parametrize("work", [1, 150, 300, 1000])
def test_a_chunk_over_a_long_cached_prefix_is_cut_across_steps_and_changes_no_output(
    tiny: RandomModel, work: int
) -> None:
    cfg = SchedulerConfig(mixed_prefill_attention=work)
    sizes, reqs, prompts = _run_long_beside_a_decode(tiny, cfg)
    end = len(prompts[1])  # a fresh request prefills its whole prompt (the last chunk gives its first token)
    assert sizes == _expected_chunks(PREFIX, end, work, cfg.mixed_prefill_tokens)
    if work < _work(PREFIX, end - PREFIX):
        assert len(sizes) > 1
    _assert_same(reqs, [_uncached(tiny, prompts[:1], 40)[0], _uncached(tiny, prompts[1:], 3)[0]])


def test_without_the_option_the_chunk_runs_in_one_step(tiny: RandomModel) -> None:
    sizes, reqs, prompts = _run_long_beside_a_decode(tiny, SchedulerConfig())
    assert sizes == [len(prompts[1]) - PREFIX]
    _assert_same(reqs, [_uncached(tiny, prompts[:1], 40)[0], _uncached(tiny, prompts[1:], 3)[0]])


def test_with_nothing_decoding_the_attention_bound_does_not_apply(tiny: RandomModel) -> None:
    prefix = ids(PREFIX, 1)
    long = [*prefix, *ids(14, 3)]
    engine = Engine(tiny, capacity_blocks=128, page_size=P, scheduler_config=SchedulerConfig(mixed_prefill_attention=1))
    engine.generate(prefix, 1, ignore_eos=True)
    passes = engine.runner.passes
    got = engine.generate(long, 3, ignore_eos=True, return_logits=True)
    assert got.cached_tokens == PREFIX
    assert engine.runner.passes - passes == 3, "one prefill pass, then two decode passes"
    _assert_same_result(got, _uncached(tiny, [long], 3)[0])
    assert_clean(engine)


def _assert_same_result(got: object, want: object) -> None:
    assert got.token_ids == want.token_ids  # type: ignore[attr-defined]
    assert (got.logits - want.logits).abs().max().item() < TOL  # type: ignore[attr-defined]


@pytest.mark.parametrize("start", [0, 1, 7, 64, 1999])
def test_tokens_within_attention_is_the_most_that_fit(start: int) -> None:
    for work in [0, 1, 2, start, start + 1, 2 * start + 3, 5000, 123_457]:
        n = tokens_within_attention(start, work)
        assert _work(start, n) <= work and _work(start, n + 1) > work


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "4096", float("inf")])
def test_a_value_that_is_not_a_positive_int_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match=r"mixed_prefill_attention must be None .* or an int >= 1"):
        SchedulerConfig(mixed_prefill_attention=bad)  # type: ignore[arg-type]
