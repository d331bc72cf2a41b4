"""An output's text with a SentencePiece tokenizer (Llama 2, Mistral 7B tokenizer.json: "▁" for a space, byte
fallback, a decoder that strips the leading space of what it decodes) is what it adds after its prompt, as vLLM
reads it: the result and the stream decoded the output alone, so a completion's first token "▁Paris" read "Paris"
where decode(prompt + output) less decode(prompt) reads " Paris". The expectation here is that full decode."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tokenizers import AddedToken, decoders, models, normalizers
from tokenizers import Tokenizer as Backend

from radixcache.runtime import Engine
from radixcache.runtime.loading.detokenizer import IncrementalDetokenizer
from radixcache.runtime.loading.tokenizer import Tokenizer
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import RandomModel, tiny_model

WORDS = ["The", "capital", "of", "France", "is", "Paris", "é", "日本"]
PROMPT = "The capital of France is"


def llama_tokenizer() -> Tokenizer:
    """Llama 2's tokenizer.json in small: "▁word" pieces with byte fallback, the normalizer's "▁" before the text,
    the decoder's Strip of one leading space."""
    special = ["<unk>", "<s>", "</s>"]
    pieces = [*special, *(f"<0x{b:02X}>" for b in range(256)), "▁", *WORDS, *(f"▁{w}" for w in WORDS)]
    scores = [(p, -1.0 if p.startswith("▁") and len(p) > 1 else -20.0) for p in pieces]
    backend = Backend(models.Unigram(scores, unk_id=0, byte_fallback=True))
    backend.add_special_tokens([AddedToken(t, special=True) for t in special])
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return Tokenizer(backend, eos_token_ids=(2,), bos_token_id=1, add_bos=True)


@pytest.fixture(scope="module")
def model() -> RandomModel:
    tok = llama_tokenizer()
    m = tiny_model(seed=7, vocab_size=tok.vocab_size, max_position=512)
    return RandomModel(m.config, m.weights, tok)


def expected(tok: Tokenizer, prompt_ids: list[int], out: tuple[int, ...]) -> str:
    """decode(prompt + output) less decode(prompt)."""
    whole, before = tok.decode(prompt_ids + list(out)), tok.decode(prompt_ids)
    assert whole.startswith(before)
    return whole[len(before) :]


def test_a_first_spaced_token_keeps_its_space_in_the_result_and_the_stream(model: RandomModel) -> None:
    tok = model.tokenizer
    paris = tok.token_to_id("▁Paris")
    prompt_ids = tok.encode(PROMPT)
    with Engine(model, capacity_blocks=128, page_size=4) as engine:
        bias = {paris: 100.0}  # the model writes "▁Paris" again and again
        result = engine.generate(PROMPT, 3, ignore_eos=True, logit_bias=bias)
        assert result.token_ids == (paris,) * 3
        assert result.text == " Paris Paris Paris" == expected(tok, prompt_ids, result.token_ids)

        async def collect() -> str:
            return "".join([d async for d in engine.stream(PROMPT, 3, ignore_eos=True, logit_bias=bias)])

        assert asyncio.run(collect()) == result.text
        assert engine.check()["locked_blocks"] == 0


@pytest.mark.parametrize("seed", range(4))
def test_random_outputs_read_as_after_their_prompt_whole_streamed_and_cut_at_a_stop(
    model: RandomModel, seed: int
) -> None:
    """Random words and spaces of the tiny model, sampled: the result, the stream, and a stop string's cut all read
    the text decode(prompt + output) shows after the prompt. (Byte tokens are barred: a run of them that is no UTF-8
    decodes to U+FFFD as a whole, so no two decodes of parts of it add up.)"""
    tok = model.tokenizer
    prompt_ids = tok.encode(PROMPT)
    no_bytes = {tok.token_to_id(f"<0x{b:02X}>"): -100.0 for b in range(256)}
    opts: dict[str, Any] = {"ignore_eos": True, "temperature": 1.0, "seed": seed, "logit_bias": no_bytes}
    with Engine(model, capacity_blocks=128, page_size=4) as engine:
        result = engine.generate(PROMPT, 24, **opts)
        want = expected(tok, prompt_ids, result.token_ids)
        assert result.text == want

        async def collect(**more: Any) -> str:
            return "".join([d async for d in engine.stream(PROMPT, 24, **opts, **more)])

        assert asyncio.run(collect()) == want
        stop = want[1:4]
        assert stop and want.find(stop) >= 1
        cut = engine.generate(PROMPT, 24, **opts, stop=stop)
        assert cut.text == want[: want.find(stop)]
        assert asyncio.run(collect(stop=stop)) == cut.text
        assert engine.check()["locked_blocks"] == 0


def test_the_incremental_detokenizer_adds_up_to_the_text_after_the_prompt() -> None:
    tok = llama_tokenizer()
    prompt_ids = tok.encode(PROMPT)
    out = tok.encode("Paris é 日本 中 is", add_special_tokens=False)  # 中: three byte tokens
    detok = IncrementalDetokenizer(tok.decode, prompt_ids)
    text = "".join(detok.add(t) for t in out) + detok.flush()
    assert text == expected(tok, prompt_ids, tuple(out)) == " Paris é 日本 中 is"


def test_the_server_keeps_the_space_whole_and_streamed(model: RandomModel) -> None:
    """The text, and the legacy logprobs' text_offset (where each token's text begins in it), whole and streamed."""
    paris = model.tokenizer.token_to_id("▁Paris")
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "temperature": 0, "logit_bias": {str(paris): 100}}
    body["logprobs"] = 0
    with Engine(model, capacity_blocks=128, page_size=4) as engine, TestClient(create_app(engine, "tiny")) as client:
        whole = client.post("/v1/completions", json=body).json()["choices"][0]
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert whole["text"] == " Paris Paris"
    assert whole["logprobs"]["tokens"] == [" Paris", " Paris"] and whole["logprobs"]["text_offset"] == [0, 6]
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [o for c in chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]] == [0, 6]
