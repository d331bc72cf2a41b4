"""A long stream through the incremental detokenizer does O(1) work a token: the text it emitted is kept in pieces
and read by its end (`length`, `since`), where each token put its delta on the whole text so far, and each reader
(stop strings, the server's stream) then copied all of it: a 100K-token stream spent 1.5 s, quadratic overall.

The work is counted, not timed: the characters read from a detokenizer's whole `text` (a data descriptor over the
attribute) and the ids it decodes, against the stream's length. The text is checked against a full decode of every
id, with characters split over byte tokens and a bad byte among them."""

from __future__ import annotations

import random
from typing import Any

import pytest

from radixcache.runtime.loading.detokenizer import IncrementalDetokenizer
from tests.runtime.loading.test_sentencepiece_output_text import llama_tokenizer

TOK = llama_tokenizer()
BYTE = {b: TOK.token_to_id(f"<0x{b:02X}>") for b in range(256)}


class CountedText:
    """Stands in for `IncrementalDetokenizer.text`, whether an attribute or a property: counts what is read."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.read = 0

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__["text"] if self.original is None else self.original.__get__(obj, owner)
        self.read += len(value)
        return value

    def __set__(self, obj: Any, value: str) -> None:
        obj.__dict__["text"] = value


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> CountedText:
    text = CountedText(IncrementalDetokenizer.__dict__.get("text"))
    monkeypatch.setattr(IncrementalDetokenizer, "text", text, raising=False)
    return text


def mixed_ids(n: int, seed: int = 0) -> list[int]:
    """Words, whole multi-byte tokens ("é", "日本"), characters as byte tokens (split over 2 to 4 tokens) and now
    and then a bad byte."""
    rng = random.Random(seed)
    pieces = [TOK.encode(w, add_special_tokens=False) for w in ("The capital", " of", " France", " é", " 日本")]
    pieces += [[BYTE[b] for b in ch.encode()] for ch in ("€", "日", "🙂", "x")]
    pieces.append([BYTE[0xFF]])
    ids: list[int] = []
    while len(ids) < n:
        ids += rng.choice(pieces)
    return ids


def test_a_long_stream_reads_its_text_once_and_decodes_each_id_a_few_times(counted: CountedText) -> None:
    ids = mixed_ids(20_000)
    calls = [0]

    def decode(window: Any) -> str:
        calls[0] += len(window)
        return TOK.decode(list(window))

    detok = IncrementalDetokenizer(decode)
    deltas = [detok.add(t) for t in ids]
    deltas.append(detok.flush())
    whole = TOK.decode(ids)
    assert "🙂" in whole and "€" in whole and "\ufffd" in whole
    assert "".join(deltas) == whole
    assert counted.read == 0, counted.read  # nothing read the whole text; each token's delta was put on all of it
    assert detok.text == whole and counted.read == len(whole)
    assert detok.length == len(whole)
    assert calls[0] <= 20 * len(ids), calls[0]  # a window of a few ids a token, not the output so far


def test_since_reads_the_end_of_the_text_as_a_slice_does() -> None:
    ids = mixed_ids(3_000, seed=1)
    detok = IncrementalDetokenizer(TOK.decode)
    rng = random.Random(2)
    for i, t in enumerate(ids):
        detok.add(t)
        if i % 97 == 0:
            text = TOK.decode(ids[: i + 1])
            sofar = detok.text  # joins the pieces: `since` then reads one chunk
            assert text.startswith(sofar)
            for start in (0, rng.randint(0, len(sofar)), len(sofar) - 1, len(sofar), len(sofar) + 5, -3):
                assert detok.since(start) == sofar[max(0, start) :]
    detok.flush()
    whole = TOK.decode(ids)
    for start in (0, 1, len(whole) // 2, len(whole) - 1):
        assert detok.since(start) == whole[start:]
