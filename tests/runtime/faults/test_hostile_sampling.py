"""Sampling that cannot fail the batch: hostile sampling values are refused at the door (a ValueError naming the
field) or made harmless (a temperature below 1e-5 is greedy), and a request whose logits go non-finite anyway fails
alone, while a greedy bystander in the same steps produces exactly its output alone (issue 31's reproduction)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import SamplingError
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.engine.sampling import SamplingParams
from radixcache.runtime.testing import RandomModel, hold_engine_loop
from tests.runtime.faults.conftest import assert_clean, ids

BYSTANDER = 300  # the greedy 300-token completion


def _engine(tiny: RandomModel) -> Engine:
    return Engine(tiny, capacity_blocks=64, page_size=16, dtype="float64")


def _alone(tiny: RandomModel, prompt: list[int]) -> tuple[int, ...]:
    with _engine(tiny) as engine:
        return engine.generate(prompt, BYSTANDER, ignore_eos=True).token_ids


@pytest.mark.parametrize(
    "hostile",
    [
        {"temperature": 1e-40},
        {"temperature": 0.7, "repetition_penalty": 1e-300},
        {"temperature": 1e-30, "repetition_penalty": 1e-300, "presence_penalty": 2.0},
    ],
    ids=["tiny-temperature", "tiny-repetition-penalty", "both"],
)
def test_a_hostile_request_beside_a_greedy_bystander_leaves_its_output_as_alone(
    tiny: RandomModel, hostile: dict[str, float]
) -> None:
    bystander = ids(20, 1)
    alone = _alone(tiny, bystander)
    engine = _engine(tiny)
    release = hold_engine_loop(engine)  # both reach the scheduler together: they share every step
    try:
        mine = engine.submit(bystander, BYSTANDER, ignore_eos=True)
        try:
            theirs = engine.submit(ids(12, 2), 40, ignore_eos=True, **hostile)
        except ValueError as exc:  # refused at the door: say which field
            assert any(name in str(exc) for name in hostile)
            theirs = None
    finally:
        release()
    assert mine.result(60).token_ids == alone
    if theirs is not None:  # accepted: it is harmless (a tiny temperature is greedy) or fails alone
        with contextlib.suppress(SamplingError):
            assert len(theirs.result(60).token_ids) == 40
    assert_clean(engine)


def test_logits_that_go_non_finite_anyway_fail_only_their_request(tiny: RandomModel) -> None:
    """Defence in depth: a sampler whose values slipped past validation (set behind its back) fails its request
    with a SamplingError, and the bystanders of the same steps (greedy, sampled, penalised) are untouched."""
    prompts = [ids(20, 3), ids(17, 4), ids(25, 5)]
    kinds = [{}, {"temperature": 0.8, "seed": 3}, {"repetition_penalty": 1.3, "logprobs": 2}]
    with _engine(tiny) as ref:
        alone = [ref.generate(p, 30, ignore_eos=True, **k).token_ids for p, k in zip(prompts, kinds, strict=True)]
    engine = _engine(tiny)
    release = hold_engine_loop(engine)
    try:
        handles = [engine.submit(p, 30, ignore_eos=True, **k) for p, k in zip(prompts, kinds, strict=True)]
        victim = engine.submit(ids(15, 6), 30, ignore_eos=True, temperature=0.5, seed=1)
        params = victim.request.sampler.params
        object.__setattr__(params, "repetition_penalty", 1e-300)  # what validation refuses, reaching the sampler
    finally:
        release()
    with pytest.raises(SamplingError, match="non-finite"):
        victim.result(60)
    assert [h.result(60).token_ids for h in handles] == alone
    assert_clean(engine)


def test_a_nan_row_of_the_batched_argmax_fails_only_its_request(tiny: RandomModel) -> None:
    """Plain greedy rows are decided by one argmax over the whole batch: a row of NaN logits (a model fault for one
    request) fails that request alone instead of choosing a token from garbage."""
    prompts = [ids(20, 7), ids(18, 8)]
    with _engine(tiny) as ref:
        alone = [ref.generate(p, 20, ignore_eos=True).token_ids for p in prompts]
    engine = _engine(tiny)
    victim_prompt = ids(16, 9)
    real = engine.model.forward

    def poisoned(pool: object, *, decode: object = None, chunks: object = ()) -> object:
        out = real(pool, decode=decode, chunks=chunks)  # type: ignore[arg-type]
        for i, chunk in enumerate(chunks):  # type: ignore[arg-type]
            if list(chunk.token_ids[:4]) == victim_prompt[:4] and out.chunks is not None:
                out.chunks[i] = float("nan")
        return out

    engine.model.forward = poisoned  # type: ignore[method-assign]
    release = hold_engine_loop(engine)
    try:
        handles = [engine.submit(p, 20, ignore_eos=True) for p in prompts]
        victim = engine.submit(victim_prompt, 20, ignore_eos=True)
    finally:
        release()
    with pytest.raises(SamplingError, match="non-finite"):
        victim.result(60)
    assert [h.result(60).token_ids for h in handles] == alone
    assert_clean(engine)


def test_a_temperature_below_1e_5_is_greedy(tiny: RandomModel) -> None:
    prompt = ids(20, 10)
    with _engine(tiny) as engine:
        greedy = engine.generate(prompt, 25, ignore_eos=True).token_ids
        assert engine.generate(prompt, 25, ignore_eos=True, temperature=1e-6).token_ids == greedy
        assert engine.generate(prompt, 25, ignore_eos=True, temperature=5e-324).token_ids == greedy
    assert SamplingParams(temperature=1e-6).greedy and not SamplingParams(temperature=1e-4).greedy


BAD_SAMPLING = [
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", -0.5),
    ("temperature", "hot"),
    ("temperature", 1e9),
    ("top_p", math.nan),
    ("top_k", -1),
    ("top_k", 2.5),
    ("top_k", True),
    ("min_p", math.nan),
    ("presence_penalty", math.inf),
    ("frequency_penalty", math.nan),
    ("repetition_penalty", 1e-300),
    ("repetition_penalty", math.inf),
    ("repetition_penalty", math.nan),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", 1e300),
    ("max_new_tokens", 0),
    ("max_new_tokens", 1.5),
    ("max_new_tokens", True),
    ("seed", "x"),
    ("seed", 1.5),
    ("logprobs", 21),
    ("stop_token_ids", [-1]),
    ("logit_bias", {"5": math.nan}),
    ("ignore_eos", "no"),  # was true: the request ran past its end of text to max_new_tokens
    ("ignore_eos", 0),
]


@pytest.mark.parametrize(("field", "value"), BAD_SAMPLING, ids=[f"{f}={v!r}" for f, v in BAD_SAMPLING])
def test_bad_sampling_values_are_refused_at_the_door_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        RequestOptions.of(**{"max_new_tokens": 8, field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [("timeout", math.nan), ("timeout", math.inf), ("priority", 1.5), ("return_logits", "no"), ("return_logits", 1)],
)
def test_bad_request_options_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        RequestOptions.of(**{"max_new_tokens": 8, field: value})


def test_a_nan_namespace_is_refused_and_the_tree_stays_checkable(tiny: RandomModel) -> None:
    """A NaN namespace hashes but never equals a copy of itself: its nodes failed the tree's own invariant check
    (each node's namespace equals its root's), so `check()` reported a broken cache, and no other NaN ever hit it."""
    with _engine(tiny) as engine:
        with pytest.raises(ValueError, match="namespace"):
            engine.generate(ids(40, 1), 4, namespace=math.nan)
        with pytest.raises(ValueError, match="namespace"):
            engine.unpin(namespace=math.nan)
        assert engine.generate(ids(40, 1), 4, namespace="t").finish_reason == "length"
        assert_clean(engine)


def test_sane_edge_values_are_accepted() -> None:
    SamplingParams(temperature=0.0, top_p=1.0, min_p=0.0, repetition_penalty=0.01, presence_penalty=-2.0)
    SamplingParams(temperature=100.0, top_k=0, repetition_penalty=100.0, frequency_penalty=2.0, seed=2**63 - 1)
    assert torch.isfinite(torch.tensor(SamplingParams(temperature=1e-5).temperature))


def test_stop_none_is_no_stop_strings_as_agent_frameworks_pass_it(tiny: RandomModel) -> None:
    """An agent framework's completion hook passes its own `stop=None` default through (`generate(prompt,
    stop=stop)`), as OpenAI's API takes `"stop": null`: it was a ValueError ("stop must be a string or a list of
    strings, got None"), as was stop_token_ids=None, while logit_bias=None meant none. None is none for all three."""
    prompt = ids(40, 1)
    with _engine(tiny) as engine:
        plain = engine.generate(prompt, 8, ignore_eos=True)
        given = engine.generate(prompt, 8, ignore_eos=True, stop=None, stop_token_ids=None, logit_bias=None)
        assert given.token_ids == plain.token_ids and given.finish_reason == "length"
        session = engine.session(stop=None, max_new_tokens=2, ignore_eos=True)  # its defaults are built once
        assert session.options.sampling.stop == () and session.options.sampling.stop_token_ids == ()
        opts = RequestOptions.of(4, stop=["x"], stop_token_ids=[3])
        kept = opts.updated(stop=None, stop_token_ids=None).sampling  # None over a stop: "not given", kept
        assert kept.stop == ("x",) and kept.stop_token_ids == (3,)
        assert opts.updated(stop=[], stop_token_ids=[]).sampling.stop == ()  # the empty list clears it
        assert_clean(engine)
