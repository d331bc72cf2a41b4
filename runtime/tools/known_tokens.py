"""Prompt text that carries the exact token ids the model emitted for some of its spans.

A model does not always emit the tokenizer's canonical split of its own text: under a grammar especially, SmolLM2
writes `"` then `}}` where encoding the same text gives `"}` then `}`. An agent's next prompt replays those calls as
text, and encoding that text canonically would differ from what the model computed from the first such token on:
the radix cache then misses the rest of the previous output (a page or more per turn), and the model reads tokens
it never wrote. So the chat template's output keeps, for each assistant turn rendered from the engine's memory of
its calls (runtime.tools.memory), where that text lies and the ids the model emitted for it; the tokenizer encodes
the text around those spans and splices the ids in (`Tokenizer.encode`).

`PromptText` is a `str`, so it flows wherever a prompt does; anything that builds a new string from it (slicing,
concatenation) gets a plain `str` back and is encoded canonically, which is correct, only less cached.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple


class KnownSpan(NamedTuple):
    """`text[start:end]` was emitted by the model as `token_ids`."""

    start: int
    end: int
    token_ids: tuple[int, ...]


class PromptText(str):
    """A prompt's text with the spans whose token ids are known (non-overlapping, in order)."""

    known: tuple[KnownSpan, ...]

    def __new__(cls, text: str, known: Sequence[KnownSpan] = ()) -> PromptText:
        self = super().__new__(cls, text)
        self.known = tuple(known)
        return self

    def __reduce__(self) -> tuple[type[PromptText], tuple[str, tuple[KnownSpan, ...]]]:
        return PromptText, (str(self), self.known)


def with_known_spans(text: str, emitted: Sequence[tuple[str, Sequence[int]]]) -> str:
    """`text` as a PromptText whose spans are each emitted text found in order (each search starts where the last
    one ended; a text not found is skipped), or `text` itself when none is found."""
    spans: list[KnownSpan] = []
    pos = 0
    for raw, ids in emitted:
        if not raw or not ids:
            continue
        start = text.find(raw, pos)
        if start < 0:
            continue
        spans.append(KnownSpan(start, start + len(raw), tuple(ids)))
        pos = start + len(raw)
    return PromptText(text, spans) if spans else text


def encode_with_known(
    text: PromptText, encode: Callable[[str, bool], list[int]], decode: Callable[[Sequence[int]], str]
) -> list[int]:
    """`text`'s ids: the pieces between known spans through `encode(piece, first)` (`first` is True only for the
    piece at the start, which may take a BOS), each known span's ids as given. A span whose ids do not decode to
    its text is encoded like the rest, so a wrong memory can cost cache hits but never change the prompt."""
    ids: list[int] = []
    pos = 0
    for span in text.known:
        if decode(span.token_ids) != text[span.start : span.end]:
            continue
        ids += encode(str(text[pos : span.start]), pos == 0)
        ids += span.token_ids
        pos = span.end
    ids += encode(str(text[pos:]), pos == 0)
    return ids
