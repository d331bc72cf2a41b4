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
from radixcache.runtime.grammar import GrammarSpec
from radixcache.runtime.loading.detokenizer import IncrementalDetokenizer, text_after
from radixcache.runtime.loading.tokenizer import Tokenizer
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import RandomModel, tiny_model
from radixcache.runtime.tools.known_tokens import KnownSpan, PromptText

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


def test_a_run_of_byte_tokens_cut_inside_a_character_keeps_its_characters() -> None:
    """A byte-fallback decoder shows a run of byte tokens that is not all UTF-8 as U+FFFD whole: "中文" and one byte
    of the next character read as seven U+FFFD, which the result's text was, while the stream had shown "中文". Each
    complete character of the run is kept and each byte no character takes is one U+FFFD (loading/byte_fallback.py),
    whole and streamed."""
    tok = llama_tokenizer()
    prompt_ids = tok.encode(PROMPT)
    byte = {b: tok.token_to_id(f"<0x{b:02X}>") for b in range(256)}
    for data, tail in [("中文".encode() + b"\xe4", ""), (b"G\xe4", " Paris"), (b"\xe6\x96\x87\xad", " is")]:
        ids = [byte[b] for b in data] + tok.encode(tail, add_special_tokens=False)[1:]  # [1:]: no lone "▁" first
        assert "\ufffd" in tok.decode(prompt_ids + ids)[len(tok.decode(prompt_ids)) :]  # the decoder's own reading
        detok = IncrementalDetokenizer(tok.decode, prompt_ids)
        streamed = "".join(detok.add(t) for t in ids) + detok.flush()
        assert text_after(tok.decode, prompt_ids, ids) == streamed
        assert streamed == (data + tail.encode()).decode("utf-8", "replace")  # one bad byte each: one U+FFFD


def test_a_reply_cut_inside_a_character_keeps_its_characters_whole_and_streamed(model: RandomModel) -> None:
    """Bytes the grammar forces ("中文中", nine byte tokens), cut by the length limit after seven: the result read
    seven U+FFFD, and the stream (which showed "中文") never got its end. The cut character's byte is one U+FFFD, as
    a byte-level tokenizer's decoder shows it."""
    grammar = GrammarSpec.regex("中文中")
    with Engine(model, capacity_blocks=128, page_size=4) as engine:
        result = engine.generate(PROMPT, 7, grammar=grammar)
        assert result.finish_reason == "length" and len(result.token_ids) == 7
        assert result.text == "中文\ufffd"

        async def collect() -> str:
            return "".join([d async for d in engine.stream(PROMPT, 7, grammar=grammar)])

        assert asyncio.run(collect()) == result.text
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 7, "regex": "中文中"}
        with TestClient(create_app(engine, "tiny")) as client:
            whole = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
            with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert whole == "中文\ufffd"
        assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == whole


def test_a_reply_that_starts_with_a_space_is_replayed_as_the_tokens_the_model_wrote() -> None:
    """A reply's text keeps the space of its first token (" Paris"), which the ids the engine remembers for it, decoded
    alone, do not show: the known span never matched, and the next prompt encoded the text anew ("▁Paris" where the
    model wrote "▁" then the letters), a cache miss from there on."""
    tok = llama_tokenizer()
    wrote = [tok.token_to_id("▁")] + [tok.token_to_id(f"<0x{b:02X}>") for b in b"Paris"]
    text = "[INST] hi [/INST] Paris</s>"
    start = text.index(" Paris")
    prompt = PromptText(text, [KnownSpan(start, start + len(" Paris"), tuple(wrote))])
    assert tok.encode(text[start : start + 6], add_special_tokens=False) != wrote  # not the canonical split
    assert tok.encode(prompt) == tok.encode(text[:start]) + wrote + tok.encode(text[start + 6 :], False)


@pytest.mark.parametrize("after", [" </s>[INST] is [/INST]", " \n[INST] is [/INST]", " is Paris"])
def test_a_known_span_never_changes_the_prompts_text(after: str) -> None:
    """The pieces after a known span were encoded on their own, and a SentencePiece tokenizer puts a "▁" before
    whatever it encodes: "Paris" + " </s>" read "Paris  </s>" (Llama 2's template writes a space before its eos),
    another prompt than the text. The prompt's text is the canonical encoding's; the span's ids are kept."""
    tok = llama_tokenizer()
    wrote = [tok.token_to_id("▁")] + [tok.token_to_id(f"<0x{b:02X}>") for b in b"Paris"]
    text = "[INST] hi [/INST] Paris" + after
    start = text.index(" Paris")
    ids = tok.encode(PromptText(text, [KnownSpan(start, start + len(" Paris"), tuple(wrote))]))
    assert tok.decode(ids, skip_special_tokens=False) == tok.decode(tok.encode(text), skip_special_tokens=False)
    assert any(ids[i : i + len(wrote)] == wrote for i in range(len(ids)))  # the model's own tokens: a cache hit


def test_an_output_that_completes_the_prompts_last_character_keeps_what_it_wrote() -> None:
    """A prompt of token ids may end inside a character (the first two bytes of 日): the context's text then ended in
    U+FFFD, one for each byte, and the output's text, cut at that length, lost what the output wrote ("日AB" read
    "B"). The character is the output's; the stream and the result agree."""
    tok = llama_tokenizer()
    byte = {b: tok.token_to_id(f"<0x{b:02X}>") for b in range(256)}
    prompt = [*tok.encode("The"), byte[0xE6], byte[0x97]]
    out = [byte[0xA5], byte[ord("A")], byte[ord("B")]]
    assert tok.decode(prompt + out) == "The日AB"  # the independent expectation: all but the prompt's whole "The"
    assert text_after(tok.decode, prompt, out) == "日AB"
    stream = IncrementalDetokenizer(tok.decode, prompt)
    deltas = [stream.add(t) for t in out]
    assert "".join(deltas) + stream.flush() == "日AB"


@pytest.mark.parametrize("tokenizer", ["llama", "byte-level"])
def test_a_prompts_broken_last_character_stays_the_prompts_when_the_output_does_not_complete_it(
    tokenizer: str, tmp_path: Any
) -> None:
    """A prompt ending in a character's first byte that the output does not complete: that byte is the prompt's, so
    the output's text is what it wrote ("K3"), not U+FFFD first (a completion's first logprob offset read 1)."""
    from tests.cli.conftest import write_tiny_checkpoint

    tok = llama_tokenizer() if tokenizer == "llama" else Tokenizer.from_hf_dir(write_tiny_checkpoint(tmp_path / "t"))
    lead = next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == b"\xe6")
    prompt = [*tok.encode("The", add_special_tokens=False), lead]
    out = tok.encode("K3", add_special_tokens=False)
    want = expected(tok, prompt, tuple(out))  # decode(prompt + output) less decode(prompt): "K3" (" K3" for llama)
    assert want.strip() == "K3" and "\ufffd" not in want
    assert text_after(tok.decode, prompt, out) == want
    stream = IncrementalDetokenizer(tok.decode, prompt)
    deltas = [stream.add(t) for t in out]
    assert "".join(deltas) + stream.flush() == want
