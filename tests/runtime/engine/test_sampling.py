"""Sampling: greedy is argmax, filters keep the right tokens, seeds reproduce, stops end generation."""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime.engine.sampling import Sampler, SamplingParams, filter_logits, find_stop, stop_token_set


def test_greedy_is_argmax() -> None:
    logits = torch.tensor([0.1, 3.0, -1.0, 2.9])
    assert Sampler(SamplingParams()).sample(logits) == 1


def test_top_k_keeps_the_k_largest() -> None:
    logits = torch.tensor([1.0, 4.0, 3.0, 2.0, 0.0])
    kept = torch.isfinite(filter_logits(logits, 2, 1.0))
    assert kept.tolist() == [False, True, True, False, False]


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([0.05, 0.5, 0.3, 0.15])
    logits = probs.log()
    assert torch.isfinite(filter_logits(logits, 0, 0.5)).tolist() == [False, True, False, False]
    assert torch.isfinite(filter_logits(logits, 0, 0.79)).tolist() == [False, True, True, False]
    assert torch.isfinite(filter_logits(logits, 0, 0.81)).tolist() == [False, True, True, True]
    assert torch.isfinite(filter_logits(logits, 0, 1e-9)).tolist() == [False, True, False, False]


def test_same_seed_same_tokens_and_other_seeds_differ() -> None:
    logits = torch.zeros(1000)
    draws = {}
    for seed in (1, 1, 2):
        s = Sampler(SamplingParams(temperature=1.0, seed=seed))
        draws.setdefault(seed, []).append([s.sample(logits) for _ in range(20)])
    assert draws[1][0] == draws[1][1]
    assert draws[1][0] != draws[2][0]


def test_sampling_respects_the_filters() -> None:
    logits = torch.tensor([5.0, 4.9, 4.8, -10.0, 4.7])
    s = Sampler(SamplingParams(temperature=2.0, top_k=3, seed=0))
    assert {s.sample(logits) for _ in range(200)} == {0, 1, 2}
    one = Sampler(SamplingParams(temperature=1.0, top_k=1, seed=0))
    assert {one.sample(logits) for _ in range(20)} == {0}


def test_low_temperature_concentrates_on_the_mode() -> None:
    logits = torch.tensor([1.0, 1.5, 0.5])
    s = Sampler(SamplingParams(temperature=0.01, seed=3))
    assert {s.sample(logits) for _ in range(50)} == {1}


def test_params_are_validated_and_frozen() -> None:
    for bad in ({"max_new_tokens": 0}, {"temperature": -1}, {"top_k": -1}, {"top_p": 0.0}, {"stop": ("",)}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)  # type: ignore[arg-type]
    p = SamplingParams(stop="\n")  # type: ignore[arg-type]
    assert p.stop == ("\n",)
    with pytest.raises(AttributeError):
        p.temperature = 1.0  # type: ignore[misc]


def test_stop_tokens_include_eos_unless_ignored() -> None:
    assert stop_token_set(SamplingParams(stop_token_ids=(5,)), (2,)) == {2, 5}
    assert stop_token_set(SamplingParams(stop_token_ids=(5,), ignore_eos=True), (2,)) == {5}


def test_find_stop_returns_the_earliest_match() -> None:
    assert find_stop("abc. def\n", ["\n", "."]) == 3
    assert find_stop("abc", ["x"]) is None
