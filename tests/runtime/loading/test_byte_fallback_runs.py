"""A byte-fallback run (Llama 2, Mistral 7B: `<0xHH>` tokens) that is not all UTF-8 keeps its complete characters:
the `tokenizers` library's ByteFallback decoder shows such a run as U+FFFD whole (one per byte), so "日" followed by
a bad byte in the same run read U+FFFD U+FFFD U+FFFD U+FFFD, in the result, the stream, stop strings and
text_offset. The independent expectations: the library's own decode of each character's bytes alone, and Python's
UTF-8 decoder with one U+FFFD for each byte no character takes (SentencePiece's rule)."""

from __future__ import annotations

import asyncio
import codecs
import json

from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime import Engine
from radixcache.runtime.loading.detokenizer import IncrementalDetokenizer, text_after
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import RandomModel, tiny_model
from tests.runtime.loading.test_sentencepiece_output_text import llama_tokenizer

TOK = llama_tokenizer()
BYTE = {b: TOK.token_to_id(f"<0x{b:02X}>") for b in range(256)}
codecs.register_error("one_per_byte", lambda e: ("\ufffd", e.start + 1))


def per_byte(data: bytes) -> str:
    """Python's UTF-8 decoder, each byte that no character takes one U+FFFD."""
    return data.decode("utf-8", "one_per_byte")


def test_a_bad_byte_after_a_character_leaves_the_character_whole() -> None:
    the, ok = TOK.encode("The"), [BYTE[b] for b in b"ok"]
    ids = the + [BYTE[b] for b in "日".encode()] + [BYTE[0xFF]] + ok
    assert TOK.backend.decode(ids) == "The" + "\ufffd" * 6  # the library reads the whole run as U+FFFD
    want = TOK.backend.decode(the + [BYTE[b] for b in "日".encode()]) + TOK.backend.decode([BYTE[0xFF]])
    want += TOK.backend.decode(ok)  # the library's reading of each piece alone
    assert want == "The日\ufffdok"
    assert TOK.decode(ids) == want
    assert text_after(TOK.decode, the, ids[len(the) :]) == "日\ufffdok"
    stream = IncrementalDetokenizer(TOK.decode, the)
    assert "".join(stream.add(t) for t in ids[len(the) :]) + stream.flush() == "日\ufffdok"


@given(st.binary(max_size=24), st.booleans())
def test_any_run_of_byte_tokens_decodes_as_its_characters_and_bad_bytes(data: bytes, spaced: bool) -> None:
    prompt = TOK.encode("The capital" if spaced else "The")
    ids = [BYTE[b] for b in data]
    whole = TOK.decode(prompt + ids)
    assert whole == TOK.decode(prompt) + per_byte(data)
    want = per_byte(data)
    assert text_after(TOK.decode, prompt, ids) == want
    stream = IncrementalDetokenizer(TOK.decode, prompt)
    assert "".join(stream.add(t) for t in ids) + stream.flush() == want


def test_the_engine_and_the_server_read_the_output_after_a_prompts_bad_byte() -> None:
    """A prompt ending in "日" and a bad byte as byte tokens, and an output of byte tokens "o" (logit_bias forces
    them): they continue the prompt's run, which the library reads as U+FFFD whole, so "ooo" read "\ufffd" * 3 in the
    result, the streams and the server's text."""
    m = tiny_model(seed=7, vocab_size=TOK.vocab_size, max_position=512)
    model = RandomModel(m.config, m.weights, TOK)
    prompt = TOK.encode("The") + [BYTE[b] for b in "日".encode()] + [BYTE[0xFF]]
    bias = {BYTE[ord("o")]: 100.0}
    with Engine(model, capacity_blocks=128, page_size=4) as engine:
        result = engine.generate(prompt, 3, logit_bias=bias, ignore_eos=True)
        assert list(result.token_ids) == [BYTE[ord("o")]] * 3
        assert result.text == TOK.backend.decode(list(result.token_ids)) == "ooo"

        async def collect() -> str:
            return "".join([d async for d in engine.stream(prompt, 3, logit_bias=bias, ignore_eos=True)])

        assert asyncio.run(collect()) == result.text
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 3, "logit_bias": {str(BYTE[ord("o")]): 100}}
        with TestClient(create_app(engine, "tiny")) as client:
            whole = client.post("/v1/completions", json={**body, "logprobs": 0, "stop": ["oo"]}).json()
            with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            plain = client.post("/v1/completions", json={**body, "logprobs": 0}).json()["choices"][0]
    assert whole["choices"][0]["text"] == "" and whole["choices"][0]["finish_reason"] == "stop"  # the stop string
    assert plain["text"] == "ooo" and plain["logprobs"]["text_offset"] == [0, 1, 2]
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == plain["text"]


@settings(max_examples=200)
@given(st.text(min_size=1, max_size=4), st.text(max_size=6))
def test_a_cjk_prompt_in_byte_tokens_leaves_the_outputs_characters_whole(prompt_text: str, out_text: str) -> None:
    """Llama 2's vocabulary spells most CJK characters in byte tokens, and an output is read after its prompt's last
    5 tokens, a window that then begins inside a character (its last bytes: no UTF-8). The library read the window and
    the output's byte tokens as one bad run: "日本" then "語" read U+FFFD U+FFFD U+FFFD."""
    prompt = TOK.encode("The") + [BYTE[b] for b in prompt_text.encode()]
    out = [BYTE[b] for b in out_text.encode()]
    the = TOK.encode("The")
    assert TOK.backend.decode(the + out) == "The" + out_text  # the independent expectation: after whole characters
    assert text_after(TOK.decode, prompt, out) == out_text
    stream = IncrementalDetokenizer(TOK.decode, prompt)
    assert "".join(stream.add(t) for t in out) + stream.flush() == out_text
