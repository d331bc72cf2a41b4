"""The legacy completions' `text_offset`: where each token's text begins in the choice's text. A token that is one
byte of a character is named `bytes:\\xNN` (ten characters), which must not move the next token's offset by ten;
and a stream, whose chunks hold back text (a stop string's prefix, a character's first bytes), gives every token
the offset the whole answer gives it."""

from __future__ import annotations

from radixcache.runtime.engine.request import TokenLogprob
from radixcache.runtime.server.responses import Responder

BYTES = {1: b"h", 2: b"\xc3", 3: b"\xa9", 4: b"!", 5: b" ", 6: b"w"}  # "h", "é" in two tokens, "!", " ", "w"


def _entries(ids: list[int]) -> list[TokenLogprob]:
    return [TokenLogprob(t, -1.0, ()) for t in ids]


def test_a_token_offset_counts_characters_of_the_text_not_the_names_of_byte_tokens() -> None:
    responder = Responder("text_completion", "m", 3, token_bytes=BYTES.__getitem__)
    body = responder.logprobs(_entries([1, 2, 3, 4, 5, 6]))
    assert body is not None
    assert body["tokens"] == ["h", "bytes:\\xc3", "bytes:\\xa9", "!", " ", "w"]
    # "hé! w": both bytes of "é" belong to the character at 1; "!" is at 2
    assert body["text_offset"] == [0, 1, 1, 2, 3, 4]


def test_a_stream_gives_each_token_the_offset_of_the_whole_answer() -> None:
    ids = [1, 2, 3, 4, 5, 6]
    whole = Responder("text_completion", "m", 3, token_bytes=BYTES.__getitem__).logprobs(_entries(ids))
    assert whole is not None
    stream = Responder("text_completion", "m", 3, token_bytes=BYTES.__getitem__)
    offsets = []
    for part in ([1, 2], [3], [4, 5], [6]):  # chunks of one choice, as the stream sends them
        body = stream.logprobs(_entries(part), 0)
        assert body is not None
        offsets += body["text_offset"]
    assert offsets == whole["text_offset"]
    other = stream.logprobs(_entries([4]), 1)  # another choice counts from its own start
    assert other is not None and other["text_offset"] == [0]


def _offsets(client, stream: bool, **kw):
    if not stream:
        choice = client.completions.create(**kw).choices[0]
        return choice.text, choice.logprobs.tokens, choice.logprobs.text_offset
    text, tokens, offsets = "", [], []
    for chunk in client.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs:
                tokens += choice.logprobs.tokens
                offsets += choice.logprobs.text_offset
    return text, tokens, offsets


def test_offsets_over_http_index_the_text_and_agree_between_stream_and_whole(client) -> None:
    byte_tokens = 0
    for prompt in ("text offsets one", "text offsets two", "offsets three", "four offsets"):
        for stop in (None, ["ab", "b"], ["zz"]):
            kw = {"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": 1, "stop": stop}
            text, tokens, offsets = _offsets(client, False, **kw)
            assert _offsets(client, True, **kw) == (text, tokens, offsets)
            assert offsets == sorted(offsets) and all(o <= len(text) for o in offsets), (text, offsets)
            for k, token in enumerate(tokens):
                byte_tokens += token.startswith("bytes:")
                if not token.startswith("bytes:"):  # whole characters: found at its offset (or cut by a stop)
                    assert text[offsets[k] : offsets[k] + len(token)] in (token, token[: len(text) - offsets[k]])
    assert byte_tokens  # the tiny model writes bytes that are parts of characters: the case this is about
