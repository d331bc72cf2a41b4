"""SchedulerConfig.staged_prefill_attention: while requests decode, a chunk whose attention work (query tokens x
positions attended) is over the bound runs its decoder layers over several passes (model.staged), one range a
step beside the decodes, as the step's only chunk; its positions count only once its last layer ran. The decode
gets a token every step; outputs equal the no-cache engine's; a cancel, the decode finishing, or a pass that
raises mid-stage leave the cache clean and the outputs right."""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.engine.prefill_budget import StepBudget, chunk_attention, layers_per_pass
from radixcache.runtime.engine.scheduler import SchedulerConfig
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

from .conftest import assert_clean, ids

P = 4
TOL = 1e-4
LAYERS = 5
PREFIX = 64


@pytest.fixture(scope="module")
def deep() -> RandomModel:
    m = tiny_model(seed=11, num_layers=LAYERS)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def _uncached(model: RandomModel, prompt: list[int], max_new: int):
    engine = Engine(model, capacity_blocks=128, page_size=P, enable_cache=False)
    return engine.generate(prompt, max_new, ignore_eos=True, return_logits=True)


def _same(req, want) -> None:
    assert tuple(req.output_ids) == want.token_ids
    assert (torch.stack(req.logits) - want.logits).abs().max().item() < TOL


def _beside_a_decode(model: RandomModel, bound: int, decode_tokens: int = 40):
    """An engine that cached PREFIX tokens, a decode running, and the prefix plus 14 new tokens just added."""
    engine = Engine(
        model, capacity_blocks=128, page_size=P, scheduler_config=SchedulerConfig(staged_prefill_attention=bound)
    )
    prefix, short = ids(PREFIX, 1), ids(6, 2)
    engine.generate(prefix, 1, ignore_eos=True)
    assert engine.wait_idle(30)  # the loop thread has left: it would step what the test adds by hand
    dec = engine._request(short, decode_tokens, ignore_eos=True, return_logits=True)
    req = engine._request([*prefix, *ids(14, 3)], 3, ignore_eos=True, return_logits=True)
    sched = engine.scheduler
    sched.add(dec)
    while not dec.output_ids:
        sched.step()
    sched.add(req)
    return engine, dec, req


def _finish(engine: Engine) -> None:
    while engine.scheduler.has_work():
        engine.scheduler.step()
    engine.scheduler.drain()
    assert_clean(engine)


@pytest.mark.parametrize("bound", [100, 300, 600])
def test_a_chunk_over_the_bound_runs_its_layers_over_several_steps_beside_the_decode(
    deep: RandomModel, bound: int
) -> None:
    engine, dec, req = _beside_a_decode(deep, bound)
    sched = engine.scheduler
    work = chunk_attention(PREFIX, 14)
    per_pass = layers_per_pass(work, bound, LAYERS)
    want_stops = [*range(per_pass, LAYERS, per_pass), LAYERS]
    with torch.inference_mode():
        stops = []
        while not req.output_ids:
            made, passes = len(dec.output_ids), engine.runner.passes
            sched.step()
            assert engine.runner.passes == passes + 1 and len(dec.output_ids) == made + 1, "the decode goes on"
            if req.staged is not None:
                assert req.kv.num_kv == PREFIX, "no position counts before the last layer"
                stops.append(req.staged.next_layer)
            elif req.kv.num_kv > PREFIX:
                assert req.kv.num_kv == PREFIX + 14
                stops.append(LAYERS)
        _finish(engine)
    assert stops == want_stops and len(stops) > 1
    assert req.kv.cached_tokens == PREFIX
    _same(dec, _uncached(deep, ids(6, 2), 40))
    _same(req, _uncached(deep, [*ids(PREFIX, 1), *ids(14, 3)], 3))


def test_a_chunk_within_the_bound_runs_in_one_step(deep: RandomModel) -> None:
    engine, _, req = _beside_a_decode(deep, chunk_attention(PREFIX, 14))
    with torch.inference_mode():
        while not req.output_ids:
            engine.scheduler.step()
            assert req.staged is None
        _finish(engine)
    _same(req, _uncached(deep, [*ids(PREFIX, 1), *ids(14, 3)], 3))


def test_a_cancel_mid_stage_frees_everything_and_the_decode_goes_on(deep: RandomModel) -> None:
    engine, dec, req = _beside_a_decode(deep, 100)
    with torch.inference_mode():
        while req.staged is None or req.staged.next_layer == 0:
            engine.scheduler.step()
        assert engine.scheduler.abort(req)
        assert req.staged is None and req.finish_reason == "cancelled"
        _finish(engine)
    _same(dec, _uncached(deep, ids(6, 2), 40))


def test_when_the_decodes_end_mid_stage_the_rest_of_the_layers_run_at_once(deep: RandomModel) -> None:
    engine, dec, req = _beside_a_decode(deep, 100, decode_tokens=3)
    sched = engine.scheduler
    with torch.inference_mode():
        while dec in sched.decoding:
            sched.step()
        assert req.staged is not None and 0 < req.staged.next_layer < LAYERS
        sched.step()  # nothing decodes: every layer left, in this pass
        assert req.staged is None and req.output_ids
        _finish(engine)
    _same(req, _uncached(deep, [*ids(PREFIX, 1), *ids(14, 3)], 3))


def test_a_pass_that_raises_mid_stage_is_retried_and_changes_no_output(deep: RandomModel) -> None:
    engine, dec, req = _beside_a_decode(deep, 100)
    real, failed = engine.runner.step, []

    def flaky(decodes, chunks):
        if not failed and any(r.staged is not None and r.staged.next_layer > 0 for r, _ in chunks) and decodes:
            failed.append(True)
            raise RuntimeError("injected")
        return real(decodes, chunks)

    engine.runner.step = flaky  # type: ignore[method-assign]
    with torch.inference_mode():
        _finish(engine)
    assert failed and dec.error is None and req.error is None
    _same(dec, _uncached(deep, ids(6, 2), 40))
    _same(req, _uncached(deep, [*ids(PREFIX, 1), *ids(14, 3)], 3))


@pytest.mark.parametrize(("work", "bound", "want"), [(1000, 1000, 5), (1001, 1000, 3), (5000, 1000, 1), (10, 1, 1)])
def test_layers_per_pass_spreads_the_layers_evenly(work: int, bound: int, want: int) -> None:
    assert layers_per_pass(work, bound, LAYERS) == want


def test_without_decodes_or_within_the_bound_nothing_is_staged() -> None:
    assert StepBudget(24, 512, None, None).staging(PREFIX, 14, LAYERS) is None
    assert StepBudget(24, 512, None, 10**6).staging(PREFIX, 14, LAYERS) is None
    st = StepBudget(24, 512, None, 100).staging(PREFIX, 14, LAYERS)
    assert st is not None and (st.tokens, st.per_pass, st.next_layer, st.stop) == (14, 1, 0, 1)


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "4096"])
def test_a_value_that_is_not_a_positive_int_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match=r"staged_prefill_attention must be None .* or an int >= 1"):
        SchedulerConfig(staged_prefill_attention=bad)  # type: ignore[arg-type]
