"""Prompt text that carries the exact token ids the model emitted for some of its spans.

A model does not always emit the tokenizer's canonical split of its own text: under a grammar especially, SmolLM2
writes `"` then `}}` where encoding the same text gives `"}` then `}`. An agent's next prompt replays those calls as
text, and encoding that text canonically would differ from what the model computed from the first such token on:
the radix cache then misses the rest of the previous output (a page or more per turn), and the model reads tokens
it never wrote. So the chat template's output keeps, for each assistant turn rendered from the engine's memory of
its calls (runtime.tools.memory), where that text lies and the ids the model emitted for it; the tokenizer encodes
the text around those spans and splices the ids in (`Tokenizer.encode`).

A template that prints whitespace between a prompt and the reply's content (Mistral v0.3's `" " + content|trim`)
has it left out before each such span: the model wrote its reply right after its prompt (`[/INST][TOOL_CALLS]`),
and with the space the next prompt missed the cache from the reply on.

A template that wraps a plain reply and numbers results by their calls (Command R7B's) renders a remembered reply
through its own layout instead, and the ids the model emitted take the place of what it printed for the reply
(runtime/tools/emitted_turns.py).

`PromptText` is a `str`, so it flows wherever a prompt does; anything that builds a new string from it (slicing,
concatenation) gets a plain `str` back and is encoded canonically, which is correct, only less cached.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple


class KnownSpan(NamedTuple):
    """`text[start:end]` was emitted by the model as `token_ids`; `literal`: a tool result's special-token text,
    `token_ids` its plain-text ids (runtime/tools/literal_text.py), never read as the control token, not even where
    the prompt is encoded anew."""

    start: int
    end: int
    token_ids: tuple[int, ...]
    literal: bool = False


class PromptText(str):
    """A prompt's text with the spans whose token ids are known (non-overlapping, in order)."""

    known: tuple[KnownSpan, ...]

    def __new__(cls, text: str, known: Sequence[KnownSpan] = ()) -> PromptText:
        self = super().__new__(cls, text)
        self.known = tuple(known)
        return self

    def __reduce__(self) -> tuple[type[PromptText], tuple[str, tuple[KnownSpan, ...]]]:
        return PromptText, (str(self), self.known)


class RememberedTurn(dict):  # type: ignore[type-arg]
    """A message dict for the template: an assistant turn rendered as the text the model emitted for its calls
    (runtime.tools.memory), `token_ids` the ids it emitted that text as (empty: not known)."""

    token_ids: tuple[int, ...] = ()


def place_known(text: str, messages: Sequence[dict[str, Any]], render: Callable[[list[dict[str, Any]]], str]) -> str:
    """`text` (`render(messages)`) as a PromptText with a span where each RememberedTurn's content lies, found by
    rendering again with a random mark for that content: so an earlier copy of the same text (a user who pasted the
    call, a plain reply that said it) never takes the ids, which would change that earlier turn's tokens and leave
    the call's own encoded from its text. A template that does more than print such a content (trims or splits it)
    renders the marks into another text: then each content is searched in order (`with_known_spans`)."""
    turns = [(i, m) for i, m in enumerate(messages) if isinstance(m, RememberedTurn) and m.token_ids and m["content"]]
    if not turns:
        return text
    base = uuid.uuid4().hex  # 128 random bits: in no message (one draw: a uuid4 per turn cost more than the rest)
    marks = {i: f"<{base}:{i}>" for i, _ in turns}
    try:
        marked = render([{**m, "content": marks[i]} if i in marks else m for i, m in enumerate(messages)])
    except Exception:  # a template that refuses a mark for content (it rendered the text itself): the search below
        marked = None
    placed = None if marked is None else _substituted(marked, turns, marks)
    if placed is not None and placed[0] == text:
        found: str = PromptText(text, placed[1])
    else:
        found = with_known_spans(text, [(m["content"], m.token_ids) for _, m in turns])
    return _closed_up(found, _reply_gap(render, base)) if isinstance(found, PromptText) else found


def _reply_gap(render: Callable[[list[dict[str, Any]]], str], base: str) -> str:
    """The whitespace a template prints between the prompt a reply was generated from and the reply's content, which
    the model never wrote (Mistral v0.3's `" " + content|trim` after `[/INST]`, where the model wrote `[TOOL_CALLS]`
    at once): a one-message chat rendered without and with a reply. "" for none, for a template whose reply does not
    follow its prompt, or one that refuses such a chat."""
    mark = f"<{base}:reply>"
    try:
        asked = render([{"role": "user", "content": "u"}])
        answered = render([{"role": "user", "content": "u"}, {"role": "assistant", "content": mark}])
    except Exception:
        return ""
    if not answered.startswith(asked) or mark not in answered:
        return ""
    gap = answered[len(asked) : answered.index(mark)]
    return gap if gap and not gap.strip() else ""


def _closed_up(text: PromptText, gap: str) -> PromptText:
    """`text` without `gap` right before each known span that does not begin with it itself: the reply follows its
    prompt as the model wrote it, so the prompt extends the one the reply was generated from, token for token."""
    if not gap:
        return text
    out: list[str] = []
    spans: list[KnownSpan] = []
    pos = cut = 0
    for span in text.known:
        before = span.start - len(gap)
        closes = before >= pos and text.startswith(gap, before) and not text.startswith(gap, span.start)
        out.append(text[pos : before if closes else span.start])
        cut += len(gap) if closes else 0
        out.append(text[span.start : span.end])
        spans.append(KnownSpan(span.start - cut, span.end - cut, span.token_ids))
        pos = span.end
    out.append(text[pos:])
    return PromptText("".join(out), spans)


def _substituted(
    marked: str, turns: list[tuple[int, RememberedTurn]], marks: dict[int, str]
) -> tuple[str, list[KnownSpan]] | None:
    """`marked` with each mark replaced by its turn's content, and where each content then lies; None unless every
    mark is there, in the turns' order. A mark printed twice is not looked for again (a search to the end per turn was
    quadratic: 3.5 s for 3,000 remembered calls): its other copy stays in the text returned, which then differs from
    the text rendered without marks (no mark is in it), so the caller falls back as it does for a mark not found."""
    out: list[str] = []
    spans: list[KnownSpan] = []
    pos = length = 0
    for i, turn in turns:
        start = marked.find(marks[i], pos)
        if start < 0:
            return None
        content = turn["content"]
        out += [marked[pos:start], content]
        length += start - pos
        spans.append(KnownSpan(length, length + len(content), turn.token_ids))
        length += len(content)
        pos = start + len(marks[i])
    out.append(marked[pos:])
    return "".join(out), spans


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
    text: PromptText,
    encode: Callable[[str, bool], list[int]],
    decode: Callable[[Sequence[int]], str],
    whole: Callable[[], list[int]] | None = None,
) -> list[int]:
    """`text`'s ids: the pieces between known spans through `encode(piece, first)` (`first` is True only for the
    piece at the start, which may take a BOS), each known span's ids as given. A span whose ids do not decode to
    its text is encoded like the rest, so a wrong memory can cost cache hits but never change the prompt;
    not a literal one (a tool result's special-token text), which encoded like the rest is the control token.

    A SentencePiece tokenizer (Llama 2, Mistral 7B tokenizer.json) puts a "▁" before whatever it encodes, so a piece
    after a span read with a space of its own ("Paris" + " </s>" read "Paris  </s>"): a piece after a span that does
    not spell itself loses a lone space token put first, and the whole is then kept only if its bytes are those of
    `whole()` (the text encoded as one, which it gives otherwise)."""
    ids: list[int] = []
    exact = True  # every later piece spelled itself: the prompt's text is the text's
    pos = 0
    for span in text.known:
        if not span.literal and decode(span.token_ids) != text[span.start : span.end]:
            continue  # a literal span is kept whatever it spells (an <unk> for a character the vocabulary lacks)
        piece, spelled = _piece(str(text[pos : span.start]), pos == 0, encode, decode)
        ids += piece + list(span.token_ids)
        exact &= spelled
        pos = span.end
    rest, spelled = _piece(str(text[pos:]), pos == 0, encode, decode)
    ids += rest
    if exact and spelled:
        return ids
    canonical = whole() if whole is not None else encode(str(text), True)
    return ids if decode(ids) == decode(canonical) else canonical


def _piece(
    piece: str, first: bool, encode: Callable[[str, bool], list[int]], decode: Callable[[Sequence[int]], str]
) -> tuple[list[int], bool]:
    """The ids of one piece of a prompt, and whether they spell it: the first as `encode` gives it; a later one that
    does not spell itself without a lone space token put before it."""
    ids = encode(piece, first)
    if first or decode(ids) == piece:
        return ids, True
    if ids and decode(ids[:1]) == " ":
        ids = ids[1:]
    return ids, False
