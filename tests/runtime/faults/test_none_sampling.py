"""None for a sampling option is its default in every Python entry point, as OpenAI's null is: an agent framework
passes its own unset settings through (`engine.generate(prompt, temperature=temperature, top_p=top_p, ...)` with
each None), and `temperature=None`, `top_p=None`, `top_k=None`, `min_p=None`, the penalties, `ignore_eos=None` and
`SamplingParams(max_new_tokens=None)` were each a ValueError ("temperature must be a number, got None"), while
stop=None, stop_token_ids=None, logit_bias=None and seed=None already meant none. The greedy output with every None
equals the output with nothing given; hostile values (NaN, inf, out of range, "0.7", a bool) are still refused by
name."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.engine.sampling import SamplingParams
from radixcache.runtime.testing import RandomModel
from tests.runtime.faults.conftest import assert_clean, ids

# Every sampling keyword, as a framework's defaults pass them (max_new_tokens is given on its own)
NONES = {f.name: None for f in dataclasses.fields(SamplingParams) if f.name != "max_new_tokens"}
DEFAULTS = SamplingParams()


def _engine(tiny: RandomModel) -> Engine:
    return Engine(tiny, capacity_blocks=64, page_size=16, dtype="float64")


@pytest.mark.parametrize("name", sorted(f.name for f in dataclasses.fields(SamplingParams)))
def test_none_for_each_sampling_field_is_its_default(name: str) -> None:
    assert SamplingParams(**{name: None}) == DEFAULTS
    assert RequestOptions.of(**{name: None}).sampling == DEFAULTS
    # over options that set the field, None is "not given": the options' own value is kept (a framework's own
    # temperature=None passed through a session's turn or beside options= sets nothing)
    set_ = RequestOptions.of(7, temperature=0.7, top_p=0.5, top_k=3, min_p=0.1, seed=5, stop=["x"], ignore_eos=True)
    set_ = set_.updated(presence_penalty=1.0, frequency_penalty=-1.0, repetition_penalty=1.5, logit_bias={3: 1.0})
    set_ = set_.updated(stop_token_ids=[4], logprobs=2)
    got = set_.updated(**{name: None}).sampling
    assert got == set_.sampling  # every field kept, the one given as None too
    assert got != DEFAULTS


def test_every_entry_point_takes_none_for_every_sampling_option(tiny: RandomModel) -> None:
    prompt, messages = ids(30, 1), [{"role": "user", "content": "hello there"}]
    with _engine(tiny) as engine:
        plain = engine.generate(prompt, 8, ignore_eos=True).token_ids
        plain_chat = engine.chat(messages, 8, ignore_eos=True).text
        kw = {**NONES, "ignore_eos": True}
        assert len(engine.generate(prompt, max_new_tokens=None, **kw).token_ids) == 64  # the default
        assert engine.generate(prompt, 8, **kw).token_ids == plain
        assert engine.generate([prompt, prompt], 8, **kw)[1].token_ids == plain
        assert engine.chat(messages, 8, **kw).text == plain_chat
        assert asyncio.run(engine.agenerate(prompt, 8, **kw)).token_ids == plain

        async def streamed() -> str:
            return "".join([d async for d in engine.stream(prompt, 8, **kw)])

        assert asyncio.run(streamed()) == engine.generate(prompt, 8, ignore_eos=True).text
        assert [r.token_ids for r in engine.fork(prompt, 2, 8, **kw)] == [plain, plain]
        # over options that set them, None is "not given": the options' own sampling (0.9, seed 1) is kept
        opts = RequestOptions.of(8, temperature=0.9, seed=1, ignore_eos=True)
        sampled = engine.generate(prompt, options=opts).token_ids
        assert sampled != plain  # the check below could not tell kept from reset otherwise
        assert engine.generate(prompt, options=opts, **NONES).token_ids == sampled
        handles = engine.submit_group([prompt, prompt], options=opts, each=[NONES] * 2)
        assert [h.result(60).token_ids for h in handles] == [sampled, sampled]
        session = engine.session(max_new_tokens=8, **kw)  # the session's defaults, then a turn's
        first = session.send("hello there", **NONES).text
        assert first == plain_chat
        assert_clean(engine)


BAD = [
    ("temperature", "0.7"),
    ("temperature", True),
    ("temperature", math.nan),
    ("temperature", -0.1),
    ("top_p", "0.9"),
    ("top_p", math.inf),
    ("top_k", "3"),
    ("top_k", False),
    ("min_p", -0.5),
    ("presence_penalty", "1"),
    ("frequency_penalty", math.inf),
    ("repetition_penalty", -1.0),
    ("seed", True),
    ("seed", "7"),
    ("max_new_tokens", "8"),
    ("max_new_tokens", -1),
    ("ignore_eos", "false"),
    ("logprobs", True),
]


@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_hostile_values_beside_none_are_still_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
    with pytest.raises(ValueError, match=field):
        RequestOptions.of(**{**NONES, "max_new_tokens": 4, field: value})
    with pytest.raises(ValueError, match=field):
        RequestOptions.of(4, temperature=0.5).updated(**{**NONES, field: value})
