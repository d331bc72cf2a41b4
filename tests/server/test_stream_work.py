"""The readers of a stream's text do O(1) work a token: `Engine.stream` (TextStream), the engine's stop-string search
and the server's SSE streams (chat, completions, Responses) read the detokenizer's text by its end. Each copied the
whole text so far at every token (held back for stop strings, searched, sliced): quadratic, on the event loop.

Counted, not timed: the characters read from any detokenizer's whole `text` stay a few times the text's length
(each result reads it once or twice), and the streamed text is the full decode of the output's ids after the prompt:
byte-fallback tokens (Llama 2's `<0xHH>`), so characters split over tokens, bad bytes, and stop strings that span
tokens. In-process app over the tiny random model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.loading.detokenizer import IncrementalDetokenizer
from radixcache.runtime.loading.tokenizer import Tokenizer
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import RandomModel, tiny_model
from tests.runtime.loading.test_detokenizer_work import BYTE, TOK, CountedText

TOKENS = 200  # quadratic reads would be ~TOKENS / 2 = 100 times the text: 16 times the bound below
PROMPT = TOK.encode("The capital of France is")
BIAS = {BYTE[b]: 2.0 for b in "日€".encode()}  # bytes of characters more often, so they come split over tokens
BIAS |= {t: -100.0 for t in TOK.eos_token_ids}  # no early end
SAMPLING = {"temperature": 1.0, "seed": 3, "logit_bias": BIAS}


@pytest.fixture(scope="module")
def engine() -> Any:
    m = tiny_model(seed=7, vocab_size=TOK.vocab_size, max_position=4096)
    chat = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # for the chat and Responses paths
    tok = Tokenizer(TOK.backend, eos_token_ids=TOK.eos_token_ids, bos_token_id=1, add_bos=True, chat_template=chat)
    with Engine(RandomModel(m.config, m.weights, tok), capacity_blocks=512, page_size=16) as e:
        yield e
        assert e.check()["locked_blocks"] == 0


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> CountedText:
    text = CountedText(IncrementalDetokenizer.__dict__.get("text"))
    monkeypatch.setattr(IncrementalDetokenizer, "text", text, raising=False)
    return text


def full_decode(ids: Any) -> str:
    """The text of the output after the prompt: decode(prompt + output) less decode(prompt)."""
    whole, before = TOK.decode(PROMPT + list(ids)), TOK.decode(PROMPT)
    assert whole.startswith(before)
    return whole[len(before) :]


def split_characters(text: str) -> list[str]:
    """Characters of several UTF-8 bytes that no token holds whole: the model wrote them byte by byte."""
    return [c for c in text if len(c.encode()) > 1 and c not in "é日本\ufffd"]


def sse_text(client: TestClient, path: str, body: dict[str, Any]) -> str:
    with client.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    if path == "/v1/responses":
        events = [json.loads(line[6:]) for line in lines]
        assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
        return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:])["choices"] for line in lines[:-1]]
    if path == "/v1/chat/completions":
        return "".join(c[0]["delta"].get("content") or "" for c in chunks if c)
    return "".join(c[0]["text"] for c in chunks if c)


@pytest.mark.slow  # six answers of TOKENS tokens
def test_long_streams_read_their_text_by_its_end(engine: Engine, counted: CountedText) -> None:
    sampling = {**SAMPLING, "stop": ["zzzz", "日日日日日"]}
    whole = engine.generate(PROMPT, TOKENS, **sampling)
    assert whole.finish_reason == "length"
    expected = full_decode(whole.token_ids)
    assert split_characters(expected) and "\ufffd" in expected  # characters over byte tokens, and bad bytes
    assert whole.text == expected
    counted.read = 0

    async def engine_stream() -> str:
        return "".join([d async for d in engine.stream(PROMPT, TOKENS, **sampling)])

    assert asyncio.run(engine_stream()) == expected
    # before: each token's delta was put on the whole text, then held back for the stop strings: ~TOKENS**2 / 2
    assert counted.read <= 6 * len(expected), counted.read
    body = {"model": "tiny", "max_tokens": TOKENS, **sampling, "logit_bias": {str(k): v for k, v in BIAS.items()}}
    with TestClient(create_app(engine, "tiny")) as client:
        counted.read = 0
        assert sse_text(client, "/v1/completions", {**body, "prompt": PROMPT}) == expected
        assert counted.read <= 6 * len(expected), counted.read
        chat = {**body, "messages": [{"role": "user", "content": "The capital of France is"}]}
        whole_chat = client.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"]
        assert len(whole_chat) > TOKENS / 2 and split_characters(whole_chat)
        counted.read = 0
        assert sse_text(client, "/v1/chat/completions", chat) == whole_chat
        assert counted.read <= 6 * len(whole_chat), counted.read
        responses = {k: v for k, v in chat.items() if k not in ("messages", "max_tokens")}
        responses |= {"input": chat["messages"], "max_output_tokens": TOKENS}
        counted.read = 0
        assert sse_text(client, "/v1/responses", responses) == whole_chat
        assert counted.read <= 6 * len(whole_chat), counted.read


def test_a_stop_string_over_several_tokens_cuts_every_stream_where_the_full_decode_has_it(engine: Engine) -> None:
    sampling = SAMPLING
    ids = engine.generate(PROMPT, 300, **sampling).token_ids
    text = full_decode(ids)
    at = next(i for i in range(100, len(text) - 3) if split_characters(text[i]) and "\ufffd" not in text[i - 1 : i + 2])
    stop = text[at - 1 : at + 2]  # a character of byte tokens among others: no token holds all of it
    assert not any(stop in TOK.decode([t]) for t in ids)
    expected = text[: text.index(stop)]
    assert engine.generate(PROMPT, 300, stop=[stop], **sampling).text == expected

    async def engine_stream() -> str:
        return "".join([d async for d in engine.stream(PROMPT, 300, stop=[stop], **sampling)])

    assert asyncio.run(engine_stream()) == expected
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 300, **sampling, "stop": [stop]}
    body["logit_bias"] = {str(k): v for k, v in BIAS.items()}
    with TestClient(create_app(engine, "tiny")) as client:
        assert sse_text(client, "/v1/completions", body) == expected
