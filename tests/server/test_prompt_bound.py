"""A prompt whose text cannot fit the context is refused before it is tokenised (runtime.loading.prompt_bound): a
16 MB prompt took 48 s to tokenise, the GIL held, /health and every stream waiting, for a 400. The bound never
refuses a prompt that fits (checked against the tokenizer's own count), and tokenizers that may drop text get none.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tokenizers import AddedToken, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

from radixcache.runtime import Engine
from radixcache.runtime.loading import load_config_and_tokenizer, load_model
from radixcache.runtime.loading.prompt_bound import may_be_too_long, token_bytes_bound, too_long
from radixcache.runtime.loading.tokenizer import Tokenizer
from radixcache.runtime.server import create_app

LONG = "word " * 200_000  # 1 MB: past any context here


def test_the_bound_refuses_only_prompts_the_tokenizer_counts_past_the_context(tiny_model_dir) -> None:
    tok = load_config_and_tokenizer(str(tiny_model_dir))[1]
    per_token = token_bytes_bound(tok)
    assert per_token == max(len(tok.token_bytes(i)) for i in range(tok.vocab_size))
    rng = random.Random(7)
    pieces = ["a", " ", "é", "😀", "<|im_end|>", "<|im_start|>", "\n", "ab c", "\x00"]
    refused = 0
    for _ in range(300):
        context = rng.randint(2, 60)
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8 * context)))
        size = too_long(text, context, per_token)
        if size is not None:
            refused += 1
            assert len(tok.encode(text)) >= context, (text, context)  # it could not have fit
            assert size == len(text.encode())
    assert refused > 20  # the check ran, not only its shortcut


def test_the_bound_is_reckoned_for_every_text_some_bound_refuses() -> None:
    """`may_be_too_long` (whether the tokenizer's bound must be read at all) is never False for a refused text."""
    rng = random.Random(3)
    pieces = ["a", " ", "é", "😀", "<|im_end|>", "\n", "\x00"]
    refused = spared = 0
    for _ in range(500):
        context, per_token = rng.randint(2, 40), rng.randint(4, 20)
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12 * context)))
        if too_long(text, context, per_token) is not None:
            refused += 1
            assert may_be_too_long(text, context), (text, context, per_token)
        elif len(text) >= context and not may_be_too_long(text, context):
            spared += 1  # past the context in characters, yet no bound needed
    assert refused > 20 and spared > 20


@pytest.mark.parametrize(
    "change",
    [
        lambda b: setattr(b, "normalizer", normalizers.Lowercase()),
        lambda b: setattr(b, "pre_tokenizer", pre_tokenizers.Whitespace()),  # drops the spaces
        lambda b: setattr(b, "pre_tokenizer", pre_tokenizers.Split(" ", behavior="removed")),
        lambda b: b.add_special_tokens([AddedToken("<x>", lstrip=True)]),  # "     <x>" is one token
    ],
)
def test_a_tokenizer_that_may_drop_text_gets_no_bound(change: Any) -> None:
    backend = Backend(models.BPE(vocab={"a": 0, " ": 1, "?": 2}, merges=[], unk_token="?"))
    assert token_bytes_bound(Tokenizer(backend, name="t")) == 4  # a token per character, 4 bytes at most
    change(backend)
    assert token_bytes_bound(Tokenizer(backend, name="t")) is None
    assert too_long(" " * 10_000, 8, None) is None


def test_a_tokenizer_that_drops_unknown_characters_gets_no_bound() -> None:
    """No unknown token, no byte fallback, no byte-level pre-tokenizer: "a" and 5,000 "é" are one token."""
    backend = Backend(models.BPE(vocab={"a": 0, " ": 1}, merges=[]))
    assert len(backend.encode("a" + "é" * 5_000).ids) == 1
    assert token_bytes_bound(Tokenizer(backend, name="t")) is None
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # every byte has a token: bounded
    assert token_bytes_bound(Tokenizer(backend, name="t")) is not None


@pytest.fixture
def served(tiny_model_dir, monkeypatch: pytest.MonkeyPatch) -> Any:
    with Engine(load_model(str(tiny_model_dir)), capacity_blocks=64, threads=1) as engine:
        seen: list[int] = []
        real = engine.tokenizer.encode

        def encode(text: str, *args: Any, **kwargs: Any) -> list[int]:
            seen.append(len(text))
            return real(text, *args, **kwargs)

        monkeypatch.setattr(engine.tokenizer, "encode", encode)
        with TestClient(create_app(engine, "tiny")) as client:
            yield client, seen


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": ["hi", LONG]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}),
        ("/v1/responses", {"input": LONG}),
    ],
)
def test_a_prompt_past_the_context_is_refused_untokenised(served: Any, path: str, body: dict[str, Any]) -> None:
    client, seen = served
    r = client.post(path, json={"model": "tiny", **body})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert "4096 tokens" in r.json()["error"]["message"]
    assert all(n < len(LONG) for n in seen), seen  # never handed to the tokenizer
    ok = client.post("/v1/completions", json={"model": "tiny", "prompt": "short", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == 5
