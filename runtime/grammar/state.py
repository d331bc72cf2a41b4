"""`GrammarState`: one request's position in its grammar, the mask of its next token, and EOS handling.

The mask is one bit per token id in int32 words (bit `i % 32` of word `i // 32`), the layout `masks.py` applies to
logits. While the grammar is incomplete no stop token is allowed (but where the grammar names one as its text);
once it may end, every stop token is allowed (the grammar's own continuations too, e.g. more digits); once it can
only end, only the stop tokens are. The stop tokens are the vocabulary's (the model's EOS ids) and the request's own
`stop_token_ids`: an ordinary token among those (say `,`) is cleared from the mask while the grammar is incomplete,
unless the grammar's next text can be written with no other token (then it stays, and `accept` refuses it unless it
completes the grammar: the output could neither stop there nor go on without it).
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import numpy as np

from radixcache.runtime.grammar.compiler import CompiledGrammar, matcher_error
from radixcache.runtime.grammar.errors import GrammarError


def mask_words(vocab_size: int) -> int:
    """int32 words in one mask row."""
    return (vocab_size + 31) // 32


def allocate_masks(batch: int, vocab_size: int) -> np.ndarray:
    """A zeroed (batch, words) int32 array of mask rows."""
    return np.zeros((batch, mask_words(vocab_size)), dtype=np.int32)


class GrammarState:
    """The matcher of one request. Not thread-safe: one request's tokens are handled by one thread."""

    def __init__(self, compiled: CompiledGrammar, stop_token_ids: Sequence[int] = ()) -> None:
        """`stop_token_ids`: the request's own stop tokens, beside the vocabulary's (ids past its width ignored)."""
        self.compiled = compiled
        self.vocab = compiled.vocab
        self._matcher = compiled.new_matcher()
        if (failure := self.error()) is not None:
            raise GrammarError(failure, compiled.spec.path)
        extra = [int(t) for t in stop_token_ids if 0 <= int(t) < self.vocab.vocab_size]
        self.stop_ids = tuple(dict.fromkeys([*self.vocab.stop_ids, *extra]))
        self._stops = np.asarray(self.stop_ids, dtype=np.int64)
        # the request's stop tokens the matcher may take as text: cleared while the grammar is incomplete
        self._text_stops = np.asarray([t for t in self.stop_ids if t not in self.vocab.stop_ids], dtype=np.int64)
        self._ended = False  # a stop token was accepted
        self.n_accepted = 0

    def allowed_mask(self, out: np.ndarray) -> np.ndarray:
        """Fill `out` (one int32 row of `mask_words(vocab_size)` words) with the tokens allowed next."""
        if out.dtype != np.int32 or out.shape != (mask_words(self.vocab.vocab_size),) or not out.flags.c_contiguous:
            raise ValueError(
                f"mask row must be a contiguous int32 array of shape ({mask_words(self.vocab.vocab_size)},)"
            )
        if not self.fill_without_matcher(out):
            self._matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
            self.finish_mask(out)
        return out

    # The two halves of `allowed_mask`, for `masks.fill_masks`, which computes the matchers' rows in parallel.

    def fill_without_matcher(self, out: np.ndarray) -> bool:
        """Fill `out` when the matcher has nothing to compute (ended: nothing; can only end: the stop tokens)."""
        if self._ended or self._matcher.is_error():
            out[:] = 0
            return True
        if self._matcher.is_stopped():
            out[:] = 0
            _set_bits(out, self._stops, True)
            return True
        return False

    def finish_mask(self, out: np.ndarray) -> None:
        """After the matcher filled `out`: every stop token allowed when the grammar may end here. While it may
        not, the matcher's own bits stand: it allows a stop token only where the grammar names it as its text (a
        Lark grammar's `<|im_end|>`), and clearing that one would leave nothing allowed."""
        if self._matcher.is_accepting():
            _set_bits(out, self._stops, True)
        elif len(self._text_stops):
            kept = out.copy()
            _set_bits(out, self._text_stops, False)
            if not out.any():  # the grammar's next text is a stop token alone: it stays (`accept` refuses it)
                out[:] = kept

    @property
    def matcher(self) -> llguidance.LLMatcher:
        return self._matcher

    def accept(self, token_id: int) -> None:
        """Advance past `token_id`. Raises `GrammarError` for a token the mask did not allow."""
        token_id = int(token_id)
        if token_id in self.stop_ids and not self._ended:
            if self._matcher.is_accepting():
                self._ended = True
                self.n_accepted += 1
                return
            if not self._names(token_id):  # checked first: a refused token would leave the matcher in error
                raise GrammarError("a stop token before the grammar is complete", self.compiled.spec.path)
        if self._ended or not self._matcher.consume_token(token_id):
            # the matcher's own failure, where it has one, is the cause (a lexer past its limits)
            raise GrammarError(self.error() or f"token {token_id} is not allowed here", self.compiled.spec.path)
        self.n_accepted += 1
        if token_id in self._text_stops and not self._matcher.is_accepting():  # the grammar's text, mid-output
            raise GrammarError(
                f"token {token_id} is a stop token of this request, and the only token the grammar allows at output "
                f"token {self.n_accepted - 1}: the output cannot be completed without writing it",
                "stop_token_ids",
            )

    def _names(self, stop_id: int) -> bool:
        """Whether the grammar names the stop token `stop_id` as its next text (the mask allows it unfinished)."""
        row = allocate_masks(1, self.vocab.vocab_size)[0]
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        return bool((int(row[stop_id // 32]) >> (stop_id % 32)) & 1)

    def error(self) -> str | None:
        """The matcher's failure in words, or None while it has none (`compiler.matcher_error`)."""
        return matcher_error(self._matcher, self.compiled.spec.kind)

    def is_terminated(self) -> bool:
        """True once a stop token was accepted (the grammar was complete)."""
        return self._ended

    def is_finished(self) -> bool:
        """True when nothing but a stop token can follow (or one was accepted): the output is done."""
        return self._ended or self._matcher.is_stopped()

    def is_complete(self) -> bool:
        """True when the text so far satisfies the grammar (a stop token would be accepted)."""
        return self._ended or self._matcher.is_accepting()

    def completes_after(self, back: int, token_ids: Sequence[int]) -> bool:
        """Whether the output with its last `back` tokens replaced by `token_ids` would be a sentence of the grammar
        (a stop string's cut inside a token's text), checked on a copy of the matcher: this one is unchanged."""
        if back > self.n_accepted or self._ended:
            return False
        matcher = self._matcher.deep_copy()
        if back and not matcher.rollback(back):
            return False
        for token in token_ids:
            if not matcher.consume_token(int(token)):
                return False
        return matcher.is_accepting() and not matcher.is_error()

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens (e.g. rejected speculative tokens)."""
        if n < 0 or n > self.n_accepted:
            raise ValueError(f"cannot roll back {n} of {self.n_accepted} tokens")
        if n and self._ended:
            self._ended = False
            n -= 1
            self.n_accepted -= 1
        if n and not self._matcher.rollback(n):
            raise GrammarError(self.error() or "rollback failed", self.compiled.spec.path)
        self.n_accepted -= n


def _set_bits(row: np.ndarray, ids: np.ndarray, value: bool) -> None:
    words = ids // 32
    bits = (np.int64(1) << (ids % 32)).astype(np.uint32).view(np.int32)
    for w, b in zip(words.tolist(), bits.tolist(), strict=True):
        row[w] = (row[w] | b) if value else (row[w] & ~b)
