"""The grammar mask composes with the rest of the sampler: at every step the returned logits are the model's raw
logits (an unconstrained forward of the same tokens) exactly at the tokens an independent replay of the grammar
allows and -inf elsewhere; greedy picks the best allowed token; logprobs are those of the masked distribution (a
forced token has logprob 0, the top alternatives are all allowed); logit_bias on a disallowed token changes nothing
and on an allowed one steers the choice; penalties keep outputs valid; stop strings and stop tokens end the output only
where it is complete (tests/runtime/structured/test_stop_under_grammar.py)."""

from __future__ import annotations

import json
import math

import jsonschema
import numpy as np
import torch

from radixcache.runtime import Engine
from radixcache.runtime.grammar import GrammarSpec, GrammarState, allocate_masks
from radixcache.runtime.grammar.masks import unpack_masks
from tests.runtime.structured.conftest import SCHEMAS, response_format


def allowed_after(engine: Engine, spec: GrammarSpec, tokens: list[int]) -> set[int]:
    """The tokens a fresh matcher allows after `tokens` (an independent replay of the grammar)."""
    state = GrammarState(engine._builder.grammars.compiler.compile(spec))
    for t in tokens:
        state.accept(t)
    row = allocate_masks(1, state.vocab.vocab_size)
    state.allowed_mask(row[0])
    return set(np.flatnonzero(unpack_masks(row, state.vocab.vocab_size)[0].numpy()).tolist())


def test_masked_logits_equal_the_raw_logits_at_the_allowed_tokens(engine: Engine) -> None:
    spec = GrammarSpec.from_response_format(response_format("flags"))
    prompt = engine.tokenizer.encode("mask me")
    r = engine.generate(prompt, 60, grammar=spec, return_logits=True, logprobs=4)
    assert r.finish_reason == "stop" and r.logits is not None and r.logprobs is not None
    out = list(r.token_ids)
    for i in range(0, len(out), 5):  # every fifth step against an unconstrained forward of the same tokens
        allowed = allowed_after(engine, spec, out[:i])
        finite = set(torch.isfinite(r.logits[i]).nonzero().flatten().tolist())
        assert finite == allowed & set(range(engine.config.vocab_size)), i
        raw = engine.generate(prompt + out[:i], 1, return_logits=True, ignore_eos=True).logits[0]
        index = torch.tensor(sorted(finite))
        torch.testing.assert_close(r.logits[i][index], raw[index], rtol=1e-9, atol=1e-9)
        best = max(finite, key=lambda t: float(raw[t]))
        assert out[i] == best  # greedy: the best allowed token
        lp = r.logprobs[i]
        expected = torch.log_softmax(r.logits[i], dim=-1)[out[i]]
        assert math.isclose(lp.logprob, float(expected), abs_tol=1e-9)
        assert {t for t, _ in lp.top} <= allowed
        if len(finite) == 1:
            assert lp.logprob == 0.0  # a forced token, in the masked distribution


def test_logit_bias_on_a_disallowed_token_changes_nothing(engine: Engine) -> None:
    rf = response_format("flags")
    z = engine.tokenizer.encode("z")[0]  # never allowed by this schema
    plain = engine.generate("bias", 60, response_format=rf)
    biased = engine.generate("bias", 60, response_format=rf, logit_bias={z: 100})
    assert biased.token_ids == plain.token_ids


def test_logit_bias_on_an_allowed_token_steers_the_choice(engine: Engine) -> None:
    rf = response_format("flags")
    b = engine.tokenizer.encode("b")[0]  # allowed only as the first letter of "blue"
    for seed in range(3):
        r = engine.generate("steer", 60, response_format=rf, logit_bias={b: 100}, temperature=1.0, seed=seed)
        assert json.loads(r.text)["color"] == "blue"


def test_penalties_keep_outputs_valid(engine: Engine) -> None:
    rf = response_format("nested")
    for kw in ({"repetition_penalty": 3.0}, {"frequency_penalty": 2.0, "presence_penalty": 2.0}):
        for seed in range(3):
            r = engine.generate("pen", 160, response_format=rf, temperature=0.9, seed=seed, **kw)
            jsonschema.validate(json.loads(r.text), SCHEMAS["nested"])


def test_logprobs_of_sampled_constrained_tokens_are_finite(engine: Engine) -> None:
    r = engine.generate("lp", 80, response_format=response_format("choice"), temperature=1.3, seed=4, logprobs=3)
    assert r.logprobs is not None and len(r.logprobs) == len(r.token_ids)
    assert all(math.isfinite(lp.logprob) and lp.logprob <= 0.0 for lp in r.logprobs)
    assert all(math.isfinite(v) for lp in r.logprobs for _, v in lp.top)
