"""Incremental detokenisation for streaming: text deltas that never split a UTF-8 character.

Decoding token by token is wrong twice over: byte-level tokens can end inside a multi-byte character, and some
decoders (SentencePiece's) drop or add spaces depending on the neighbours. So each step decodes a short window,
ids[prefix:], and compares it with the window up to the last emitted token, ids[prefix:read]. The difference is the
new text, held back while it ends in U+FFFD (an incomplete character). `flush()` releases whatever is left.

Bytes that never make a character (a run of lone continuation bytes, which `logit_bias` or a broken model can
produce) would hold the window open for the rest of the stream, each step decoding all of it: quadratic, on the
server's event loop. An incomplete character is at most 3 bytes, so once more than `HOLD_TOKENS` tokens are held,
those before a boundary that no character spans, a few tokens from the end, are emitted as decode shows them
(U+FFFD for each bad byte).

The text emitted so far is kept in pieces: `length` counts its characters and `since(start)` reads its end, each
costing what it returns, so a reader that looks for stop strings or sends what grew does O(1) work a token (joining
the whole text at every token made a 100K-token stream quadratic: 1.5 s on the loop). `text` joins it all: read it
once, at the end. The ids already read are dropped from the window as it moves (`TRIM_IDS`).

An output's text is what it adds after its prompt, as vLLM reads it: decoded after the prompt's last
`CONTEXT_TOKENS` tokens, less their own text (`text_after`). Decoded alone, a SentencePiece decoder (Llama 2,
Mistral 7B) drops the space of the first token, and " Paris" after "The capital of France is" read "Paris".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence

REPLACEMENT = "\ufffd"
HOLD_TOKENS = 8  # held tokens past this are bytes that will not complete a character
KEEP_TOKENS = 4  # held back even then: they may begin one (3 bytes, and a token that decodes to nothing)
CONTEXT_TOKENS = 5  # prompt tokens an output is decoded after (its first token's leading-space rules)
TRIM_IDS = 256  # ids before the window dropped once this many have gathered (amortised: a copy per TRIM_IDS ids)
CHUNK_PIECES = 256  # emitted pieces joined into one chunk once this many have gathered


def text_after(decode: Callable[[Sequence[int]], str], prompt_ids: Sequence[int], ids: Sequence[int]) -> str:
    """The text `ids` add after `prompt_ids`: decoded after the prompt's last `CONTEXT_TOKENS` tokens, less their
    own text; the concatenation of an `IncrementalDetokenizer(decode, prompt_ids)`'s deltas, fed one token at a time,
    and its flush. A text with U+FFFD is read that way, as the stream reads it (a window's text is not always the
    whole decode's, cut at the context's length)."""
    context, tail = prompt_context(decode, prompt_ids)
    whole = decode(context + tail + list(ids))
    before = decode(context) if context else ""
    if tail and whole.startswith(kept := decode(context + tail)):
        before = kept  # nothing completed the tail's character: its bytes stay the prompt's
    text = whole[len(before) :]
    if REPLACEMENT not in text:
        return text
    detok = IncrementalDetokenizer(decode, prompt_ids)
    for token in ids:
        detok.add(token)
    detok.flush()
    return detok.text


def prompt_context(decode: Callable[[Sequence[int]], str], prompt_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """The prompt's last `CONTEXT_TOKENS` tokens, split into the context an output is read after and a tail of up to
    3 tokens at its end that decode to U+FFFD. A prompt of token ids may end inside a character (its first bytes),
    which the output's first tokens complete: read after those bytes, the output's text, cut at the context's length
    (one U+FFFD a byte with a byte-fallback decoder), lost what it wrote ("The" + bytes of 日, then "日AB" read "B").
    The tail's bytes are read with the output: the character is the output's; a tail the output does not complete
    stays the prompt's (its U+FFFD is not the output's text)."""
    context = list(prompt_ids[-CONTEXT_TOKENS:]) if prompt_ids else []
    tail: list[int] = []
    for _ in range(3):
        if not context or not decode(context).endswith(REPLACEMENT):
            break
        tail.insert(0, context.pop())
    return context, tail


class IncrementalDetokenizer:
    """Feed token ids one at a time (or a few), get back the text they add.

    The concatenation of every `add()` and the final `flush()` equals `text_after(decode, prompt_ids, all_ids)`
    when the ids are added one at a time (a stream's text then adds up to its result's), and for tokenizers whose
    decode is a concatenation of per-token texts (less a leading space a SentencePiece decoder drops at the start of
    what it decodes) however they are added.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], prompt_ids: Sequence[int] = ()) -> None:
        # The prompt's last tokens give the first output token its left context (leading-space rules).
        self._decode = decode
        context, tail = prompt_context(decode, prompt_ids)
        self._ids: list[int] = context + tail  # the tail is read with the output (prompt_context)
        self._prefix = 0
        self._read = len(context)
        self._tail = len(tail)  # until the first text is emitted: the prompt's tail, which the output may complete
        self._chunks: list[str] = []  # the emitted text: joined chunks, then the latest pieces
        self._pieces: list[str] = []
        self.length = 0  # characters emitted so far

    @property
    def text(self) -> str:
        """Everything emitted so far (joins it all: O(length); `since` reads the end)."""
        if self._pieces or len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks + self._pieces)]
            self._pieces = []
        return self._chunks[0] if self._chunks else ""

    def since(self, start: int) -> str:
        """The emitted text from character `start` on (`text[start:]`), reading only the pieces it spans."""
        need = self.length - max(0, start)
        out: list[str] = []
        for part in itertools.chain(reversed(self._pieces), reversed(self._chunks)):
            if need <= 0:
                break
            out.append(part[-need:] if len(part) > need else part)
            need -= len(part)
        return "".join(reversed(out))

    def _emit(self, delta: str, read: int) -> str:
        """Record `delta` as the text of the ids up to `read`, the window moving on to them; drop the ids before it
        once `TRIM_IDS` of them have gathered."""
        self._prefix, self._read, self._tail = self._read, read, 0
        if self._prefix >= TRIM_IDS:
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        if delta:
            self._pieces.append(delta)
            self.length += len(delta)
            if len(self._pieces) >= CHUNK_PIECES:
                self._chunks.append("".join(self._pieces))
                self._pieces = []
        return delta

    def _before(self, new_text: str) -> str:
        """The text of the window's ids already read: with the prompt's tail while the output has not completed
        its character (`text_after`'s rule), else without it."""
        if self._tail:
            kept = self._decode(self._ids[self._prefix : self._read + self._tail])
            if new_text.startswith(kept):
                return kept
        return self._decode(self._ids[self._prefix : self._read])

    def add(self, token_ids: int | Iterable[int]) -> str:
        """Append ids and return the newly completed text ('' while a character is still incomplete)."""
        if isinstance(token_ids, int):
            self._ids.append(token_ids)
        else:
            self._ids.extend(token_ids)
        new_text = self._decode(self._ids[self._prefix :])
        prefix_text = self._before(new_text)
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT):
            return self._emit(new_text[len(prefix_text) :], len(self._ids))
        if len(self._ids) - self._read > HOLD_TOKENS:
            return self._emit_settled(prefix_text, new_text)
        return ""

    def _emit_settled(self, prefix_text: str, new_text: str) -> str:
        """Emit the held tokens up to a boundary that no later byte can move, keeping the last `KEEP_TOKENS` held:
        one where the window's text is the two sides' texts joined (no character, complete or not, spans it)."""
        end = len(self._ids) - KEEP_TOKENS
        for split in range(end, max(self._read, end - KEEP_TOKENS), -1):
            head = self._decode(self._ids[self._prefix : split])
            if len(head) <= len(prefix_text) or not head.startswith(prefix_text):
                continue
            if head + self._decode(self._ids[split:]) == new_text:
                return self._emit(head[len(prefix_text) :], split)
        return ""

    def flush(self) -> str:
        """The text still held back (e.g. a truncated character at the end of generation), as decode gives it."""
        new_text = self._decode(self._ids[self._prefix :])
        prefix_text = self._before(new_text)
        delta = new_text[len(prefix_text) :] if new_text.startswith(prefix_text) else ""
        self._read = len(self._ids)
        return self._emit(delta, len(self._ids))
