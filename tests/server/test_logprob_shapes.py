"""The legacy completions logprobs key alternatives by text; distinct tokens that share a text must not let a less
likely one overwrite the more likely (the tiny model's ids past its tokenizer's vocabulary all decode to "")."""

from __future__ import annotations

from radixcache.runtime.engine.request import TokenLogprob
from radixcache.runtime.server.responses import Responder

TEXTS = {1: b"a", 2: b"", 3: b"b", 4: b"", 5: b"\xe2"}


def test_tokens_sharing_a_text_keep_the_most_likely_logprob() -> None:
    responder = Responder("text_completion", "m", 3, token_bytes=TEXTS.__getitem__)
    top = ((2, -0.5), (1, -1.0), (4, -1.5), (3, -2.0), (5, -2.5))  # most likely first, as the engine gives them
    body = responder.logprobs([TokenLogprob(2, -0.5, top)])
    assert body is not None
    assert body["top_logprobs"] == [{"": -0.5, "a": -1.0, "b": -2.0, "bytes:\\xe2": -2.5}]
    assert body["tokens"] == [""] and body["token_logprobs"] == [-0.5]


def test_chat_logprobs_keep_every_alternative_even_when_texts_repeat() -> None:
    responder = Responder("chat.completion", "m", 3, token_bytes=TEXTS.__getitem__)
    top = ((2, -0.5), (4, -1.5))
    body = responder.logprobs([TokenLogprob(2, -0.5, top)])
    assert body is not None
    alternatives = body["content"][0]["top_logprobs"]
    assert [(a["token"], a["logprob"]) for a in alternatives] == [("", -0.5), ("", -1.5)]
