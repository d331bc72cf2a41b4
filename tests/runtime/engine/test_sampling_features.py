"""OpenAI / vLLM sampling features against independent expectations: logit bias, repetition / presence /
frequency penalties and min-p match naive Python loops written here; logprobs match log_softmax of the plain
reference forward (`reference_logits`) over the prompt and the generated prefix; greedy with a penalty picks the
argmax of the naively processed reference logits at every step."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from radixcache.runtime import Engine
from radixcache.runtime.engine.output import token_logprob
from radixcache.runtime.engine.request import TokenLogprob
from radixcache.runtime.engine.sampling import Sampler, SamplingParams, filter_logits
from radixcache.runtime.model.reference import reference_greedy, reference_logits
from radixcache.runtime.testing import RandomModel

TOL = 1e-4
VOCAB = 97  # the tiny model's


def ids(n: int, seed: int, vocab: int = VOCAB) -> list[int]:
    return torch.randint(1, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# ---------------------------------------------------------------------------------------------- naive references


def naive_process(
    logits: list[float],
    prompt: list[int],
    output: list[int],
    *,
    logit_bias: dict[int, float] | None = None,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
) -> list[float]:
    """The documented order, one token at a time: bias, repetition (prompt + output), presence / frequency (output)."""
    out = list(logits)
    for tok, bias in (logit_bias or {}).items():
        out[tok] += bias
    seen = set(prompt) | set(output)
    for j in range(len(out)):
        if j in seen:
            out[j] = out[j] / repetition_penalty if out[j] > 0 else out[j] * repetition_penalty
    for j in range(len(out)):
        count = 0
        for t in output:
            if t == j:
                count += 1
        out[j] -= frequency_penalty * count + presence_penalty * (1.0 if count > 0 else 0.0)
    return out


def naive_min_p_keep(logits: list[float], min_p: float) -> list[bool]:
    top = max(logits)
    probs = [math.exp(x - top) for x in logits]  # unnormalised: the ratio to the largest is what min_p compares
    return [p >= min_p for p in probs]


def naive_argmax(xs: list[float]) -> int:
    best = 0
    for j, x in enumerate(xs):
        if x > xs[best]:
            best = j
    return best


def assert_close(got: list[float], want: list[float], tol: float = TOL) -> None:
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        assert abs(g - w) <= tol * max(1.0, abs(w)), (j, g, w)


# ---------------------------------------------------------------------------------------------- the processor

logit_lists = st.integers(2, 40).flatmap(
    lambda v: st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=v, max_size=v)
)


@given(
    data=st.data(),
    logits=logit_lists,
    rep=st.floats(0.1, 3.0),
    presence=st.floats(-2.0, 2.0),
    frequency=st.floats(-2.0, 2.0),
)
def test_penalties_and_bias_match_the_naive_loops(
    data: st.DataObject, logits: list[float], rep: float, presence: float, frequency: float
) -> None:
    v = len(logits)
    prompt = data.draw(st.lists(st.integers(0, v - 1), max_size=20))
    output = data.draw(st.lists(st.integers(0, v - 1), max_size=20))
    bias = data.draw(st.dictionaries(st.integers(0, v - 1), st.floats(-100, 100), max_size=5))
    params = SamplingParams(
        repetition_penalty=rep,
        presence_penalty=presence,
        frequency_penalty=frequency,
        logit_bias=bias,  # type: ignore[arg-type]
    )
    got = Sampler(params).process(torch.tensor(logits), prompt, output).tolist()
    want = naive_process(
        logits,
        prompt,
        output,
        logit_bias=bias,
        repetition_penalty=rep,
        presence_penalty=presence,
        frequency_penalty=frequency,
    )
    assert_close(got, want)


@given(logits=logit_lists, data=st.data())
def test_the_incremental_counts_follow_a_growing_output(logits: list[float], data: st.DataObject) -> None:
    """One sampler, told the output as it grows (as the engine does), equals the naive loops at every step."""
    v = len(logits)
    prompt = data.draw(st.lists(st.integers(0, v - 1), max_size=10))
    stream = data.draw(st.lists(st.integers(0, v - 1), min_size=1, max_size=15))
    sampler = Sampler(SamplingParams(repetition_penalty=1.7, presence_penalty=0.4, frequency_penalty=0.9))
    x = torch.tensor(logits)
    output: list[int] = []
    for tok in [None, *stream]:
        if tok is not None:
            output.append(tok)
        got = sampler.process(x, prompt, output).tolist()
        want = naive_process(
            logits, prompt, output, repetition_penalty=1.7, presence_penalty=0.4, frequency_penalty=0.9
        )
        assert_close(got, want)


@given(logits=logit_lists, data=st.data())
def test_greedy_with_penalties_is_the_argmax_of_the_processed_logits(logits: list[float], data: st.DataObject) -> None:
    v = len(logits)
    output = data.draw(st.lists(st.integers(0, v - 1), max_size=10))
    want = naive_process(logits, [], output, frequency_penalty=1.3, presence_penalty=-0.5)
    top = max(want)
    assume(sum(1 for x in want if x > top - 1e-3) == 1)  # a clear winner (float32 against float64)
    params = SamplingParams(frequency_penalty=1.3, presence_penalty=-0.5)
    assert not params.plain_greedy
    assert Sampler(params).sample(torch.tensor(logits), [], output) == naive_argmax(want)


@given(logits=logit_lists, min_p=st.floats(0.0, 1.0), temperature=st.floats(0.1, 3.0), top_k=st.integers(0, 10))
def test_min_p_drops_exactly_the_tokens_the_naive_rule_drops(
    logits: list[float], min_p: float, temperature: float, top_k: int
) -> None:
    scaled = torch.tensor(logits).div(temperature).tolist()
    top = max(scaled)
    assume(all(abs(math.exp(x - top) - min_p) > 1e-5 for x in scaled))  # no token on the boundary
    kept = torch.isfinite(filter_logits(torch.tensor(scaled), top_k, 1.0, min_p)).tolist()
    want = naive_min_p_keep(scaled, min_p)
    if 0 < top_k < len(scaled):
        kth = sorted(scaled, reverse=True)[top_k - 1]
        want = [w and x >= kth for w, x in zip(want, scaled, strict=True)]
    assert kept == want
    assert kept[naive_argmax(scaled)]  # the most likely token always survives


def test_min_p_on_known_probabilities() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    keep = lambda m: torch.isfinite(filter_logits(probs.log(), 0, 1.0, m)).tolist()  # noqa: E731
    assert keep(0.0) == [True, True, True, True]
    assert keep(0.2) == [True, True, True, False]  # 0.05 < 0.2 * 0.5
    assert keep(0.5) == [True, True, False, False]  # 0.15 < 0.25 <= 0.3
    assert keep(1.0) == [True, False, False, False]


def test_sampling_with_min_p_never_draws_a_dropped_token() -> None:
    logits = torch.tensor([2.0, 1.9, 0.0, -1.0, 1.8])  # p / p_max: 1, 0.90, 0.14, 0.05, 0.82
    s = Sampler(SamplingParams(temperature=1.0, min_p=0.5, seed=0))
    assert {s.sample(logits) for _ in range(300)} == {0, 1, 4}


def test_logit_bias_forces_and_forbids_greedy_tokens() -> None:
    logits = torch.tensor([0.3, 2.0, -1.0, 1.5, 0.9])
    assert Sampler(SamplingParams(logit_bias={2: 100.0})).sample(logits) == 2  # type: ignore[arg-type]
    assert Sampler(SamplingParams(logit_bias={1: -100.0})).sample(logits) == 3  # type: ignore[arg-type]
    sampled = Sampler(SamplingParams(temperature=1.0, seed=1, logit_bias={1: -100.0, 3: -100.0}))  # type: ignore[arg-type]
    assert 1 not in {sampled.sample(logits) for _ in range(200)}


def test_plain_params_keep_the_fast_path() -> None:
    plain = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=4)
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    assert Sampler(plain).process(logits, [1, 2], [3]) is logits  # untouched: no copy, no counting
    # the same draws as before the feature: filter, softmax, multinomial on the request's own generator
    g = torch.Generator().manual_seed(4)
    want = [
        int(torch.multinomial(torch.softmax(filter_logits(logits / 0.7, 5, 0.9), -1), 1, generator=g))
        for _ in range(20)
    ]
    s = Sampler(plain)
    assert [s.sample(logits) for _ in range(20)] == want
    assert SamplingParams().plain_greedy and SamplingParams(logprobs=3, min_p=0.5, top_k=2).plain_greedy
    for kw in ({"temperature": 0.5}, {"logit_bias": {1: 1.0}}, {"repetition_penalty": 1.1}):
        assert not SamplingParams(**kw).plain_greedy  # type: ignore[arg-type]
    assert not SamplingParams(presence_penalty=0.1).plain_greedy
    assert not SamplingParams(frequency_penalty=-0.1).plain_greedy


def test_seeded_sampling_with_penalties_reproduces() -> None:
    logits = torch.randn(64, generator=torch.Generator().manual_seed(1))

    def run(seed: int) -> list[int]:
        s = Sampler(SamplingParams(temperature=1.0, seed=seed, frequency_penalty=0.8, repetition_penalty=1.3))
        out: list[int] = []
        for _ in range(30):
            out.append(s.sample(logits, [5, 6], out))
        return out

    assert run(3) == run(3)
    assert run(3) != run(4)


# ---------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("presence_penalty", 2.5),
        ("presence_penalty", float("nan")),
        ("frequency_penalty", -2.01),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("repetition_penalty", float("inf")),
        ("min_p", -0.1),
        ("min_p", 1.5),
        ("logit_bias", {3: 101.0}),
        ("logit_bias", {-1: 1.0}),
        ("logit_bias", {"x": 1.0}),
        ("logit_bias", {3: "big"}),
        ("logit_bias", ((3, 1.0), (3, 2.0))),
        ("logit_bias", 5),
        ("logprobs", -1),
        ("logprobs", 21),
        ("logprobs", 2.5),
        ("logprobs", True),
    ],
)
def test_invalid_values_raise_naming_the_field(field: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: bad})


def test_logit_bias_is_normalised_and_hashable() -> None:
    a = SamplingParams(logit_bias={7: 1.5, 2: -3})  # type: ignore[arg-type]
    b = SamplingParams(logit_bias=((2, -3.0), (7, 1.5)))
    c = SamplingParams(logit_bias={"7": 1.5, "2": -3})  # type: ignore[arg-type]  # JSON object keys
    assert a.logit_bias == ((2, -3.0), (7, 1.5))
    assert a == b == c and hash(a) == hash(b) == hash(c)
    assert SamplingParams(logit_bias={}).logit_bias == ()  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        a.logit_bias = ()  # type: ignore[misc]


def test_engine_refuses_bad_values_before_queueing(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    for kw in ({"presence_penalty": 3}, {"repetition_penalty": 0}, {"min_p": 2}, {"logprobs": 50}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            engine.generate([1, 2, 3], 2, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="logit_bias"):
        engine.generate([1, 2, 3], 2, logit_bias={VOCAB: 1.0})
    assert engine.stats.requests == 0 and engine.cache.locked_blocks == 0


# ---------------------------------------------------------------------------------------------- logprobs


def test_token_logprob_orders_ties_by_id() -> None:
    logits = torch.tensor([1.0, 3.0, 3.0, 0.0, 3.0, 2.0])
    lp = torch.log_softmax(logits, -1).tolist()
    got = token_logprob(logits, 5, 4)
    assert got.token_id == 5 and abs(got.logprob - lp[5]) < 1e-6
    assert [t for t, _ in got.top] == [1, 2, 4, 5]
    assert_close([v for _, v in got.top], [lp[1], lp[2], lp[4], lp[5]], 1e-6)
    assert [t for t, _ in token_logprob(logits, 0, 2).top] == [1, 2]  # a tie cut at k: the lower ids
    assert token_logprob(logits, 3, 0).top == ()


@given(logits=st.lists(st.integers(-3, 3), min_size=1, max_size=30), k=st.integers(0, 20), data=st.data())
def test_token_logprob_top_k_is_the_naive_sort(logits: list[int], k: int, data: st.DataObject) -> None:
    token = data.draw(st.integers(0, len(logits) - 1))
    x = torch.tensor(logits, dtype=torch.float32)
    lp = torch.log_softmax(x.double(), -1).tolist()
    got = token_logprob(x, token, k)
    want = sorted(range(len(logits)), key=lambda j: (-logits[j], j))[:k]  # integer logits: exact ties
    assert [t for t, _ in got.top] == want
    assert_close([v for _, v in got.top], [lp[j] for j in want], 1e-5)
    assert abs(got.logprob - lp[token]) < 1e-5


def reference_logprobs(model: RandomModel | Any, prompt: list[int], out: tuple[int, ...], n: int) -> torch.Tensor:
    """`[n, vocab]` float64 log_softmax of the reference forward at each generated position (full recompute)."""
    rows = reference_logits(model.config, model.weights, [*prompt, *out[: n - 1]], dtype=torch.float64)
    return torch.log_softmax(rows[len(prompt) - 1 :], dim=-1)


def check_logprobs(got: tuple[TokenLogprob, ...], out: tuple[int, ...], ref: torch.Tensor, k: int) -> None:
    for i, entry in enumerate(got[: len(ref)]):
        assert entry.token_id == out[i]
        assert abs(entry.logprob - ref[i, out[i]].item()) < TOL, (i, entry.logprob, ref[i, out[i]].item())
        top = torch.topk(ref[i], k)
        assert [t for t, _ in entry.top] == top.indices.tolist()
        assert_close([v for _, v in entry.top], top.values.tolist())


@pytest.mark.parametrize("chunk", [512, 3])
def test_logprobs_equal_the_reference_log_softmax(tiny: RandomModel, chunk: int) -> None:
    engine = Engine(tiny, capacity_blocks=128, page_size=4, prefill_chunk=chunk)
    prompt = ids(11, seed=5)
    res = engine.generate(prompt, 6, ignore_eos=True, logprobs=5)
    assert res.logprobs is not None and len(res.logprobs) == len(res.token_ids) == 6
    ref = reference_logprobs(tiny, prompt, res.token_ids, 5)
    check_logprobs(res.logprobs, res.token_ids, ref, 5)
    for i in range(5):  # greedy: the chosen token is the top one
        assert res.logprobs[i].top[0][0] == res.token_ids[i]
    again = engine.generate(prompt, 6, ignore_eos=True, logprobs=5)  # now mostly from the cache
    assert again.cached_tokens > 0 and again.token_ids == res.token_ids
    check_logprobs(again.logprobs, again.token_ids, ref, 5)  # type: ignore[arg-type]
    assert engine.generate(prompt, 3, ignore_eos=True).logprobs is None
    zero = engine.generate(prompt, 3, ignore_eos=True, logprobs=0).logprobs
    assert zero is not None and all(e.top == () for e in zero)


def test_logprobs_are_of_the_raw_distribution(tiny: RandomModel) -> None:
    """A bias forces a token; its logprob is still the model's own (not 0, as it would be after the bias)."""
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    prompt = ids(9, seed=6)
    forced = reference_greedy(tiny.config, tiny.weights, prompt, 1)[0] + 1
    res = engine.generate(prompt, 4, ignore_eos=True, logit_bias={forced: 100.0}, logprobs=3, frequency_penalty=0.5)
    assert res.token_ids == (forced,) * 4
    ref = reference_logprobs(tiny, prompt, res.token_ids, 4)
    check_logprobs(res.logprobs, res.token_ids, ref, 3)  # type: ignore[arg-type]
    assert res.logprobs[0].logprob < res.logprobs[0].top[0][1] - 1e-3  # type: ignore[index]


@pytest.mark.slow
def test_smollm2_logprobs_equal_the_reference(smollm2: Any, smollm2_fp32: Any) -> None:
    tok = smollm2.tokenizer
    engine = Engine(smollm2_fp32, tokenizer=tok, capacity_blocks=64, page_size=16)  # Engine(smollm2)'s model, shared
    prompt = tok.encode(
        tok.apply_chat_template([{"role": "user", "content": "Name a colour."}], add_generation_prompt=True)
    )
    res = engine.generate(prompt, 5, ignore_eos=True, logprobs=4)
    ref = reference_logprobs(smollm2, prompt, res.token_ids, 5)
    check_logprobs(res.logprobs, res.token_ids, ref, 4)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- the engine


@pytest.mark.parametrize(
    "kw",
    [
        {"frequency_penalty": 1.5},
        {"presence_penalty": 2.0},
        {"repetition_penalty": 1.8},
        {"repetition_penalty": 1.3, "frequency_penalty": 0.7, "presence_penalty": -0.3, "logit_bias": {5: 2.0}},
    ],
    ids=["frequency", "presence", "repetition", "all"],
)
def test_greedy_with_penalties_follows_the_naive_reference(tiny: RandomModel, kw: dict[str, Any]) -> None:
    """Every chosen token is the argmax of the reference logits processed by the naive loops (over the prompt and
    the tokens chosen before it), and the penalty changed the plain greedy continuation."""
    engine = Engine(tiny, capacity_blocks=128, page_size=4, prefill_chunk=5)
    prompt = ids(8, seed=21)
    n = 24
    res = engine.generate(prompt, n, ignore_eos=True, **kw)
    out = list(res.token_ids)
    assert len(out) == n
    rows = reference_logits(tiny.config, tiny.weights, [*prompt, *out[:-1]], dtype=torch.float64)
    for i in range(n):
        want = naive_process(rows[len(prompt) - 1 + i].tolist(), prompt, out[:i], **kw)
        assert want[out[i]] >= max(want) - TOL, (i, out[i], naive_argmax(want))
    assert out != reference_greedy(tiny.config, tiny.weights, prompt, n)


def test_plain_and_processed_greedy_rows_share_a_pass(tiny: RandomModel) -> None:
    """One group, decoded in the same passes: the plain row takes the batch argmax, the biased ones their sampler."""
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    prompt = ids(10, seed=8)
    plain = reference_greedy(tiny.config, tiny.weights, prompt, 5)
    banned = plain[0]
    handles = engine.submit_group(
        [prompt, prompt, prompt],
        5,
        ignore_eos=True,
        each=[{}, {"logit_bias": {42: 100.0}}, {"logit_bias": {banned: -100.0}}],
    )
    a, b, c = (h.result(60) for h in handles)
    assert list(a.token_ids) == plain
    assert b.token_ids == (42,) * 5
    assert c.token_ids[0] != banned
    first = reference_logits(tiny.config, tiny.weights, prompt)[-1]
    first[banned] = float("-inf")
    assert c.token_ids[0] == int(first.argmax())


def test_seeded_engine_sampling_with_penalties_reproduces(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    prompt = ids(7, seed=9)
    kw: dict[str, Any] = {"temperature": 1.0, "frequency_penalty": 0.6, "repetition_penalty": 1.2, "min_p": 0.05}
    one = engine.generate(prompt, 16, ignore_eos=True, seed=5, **kw)
    two = engine.generate(prompt, 16, ignore_eos=True, seed=5, **kw)
    other = engine.generate(prompt, 16, ignore_eos=True, seed=6, **kw)
    assert one.token_ids == two.token_ids
    assert one.token_ids != other.token_ids
