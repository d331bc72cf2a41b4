"""The grammar library's view of a tokenizer: every token's bytes, which tokens are special, which ones stop.

Built from the project's `Tokenizer` (GGUF or Hugging Face, byte-level or byte-fallback) through `token_bytes`, so
it never needs `transformers`. Special tokens (added tokens marked special, e.g. `<|im_end|>`) never match grammar
text; the stop tokens (the model's EOS ids, plus any extra stop ids) are the only tokens allowed once the grammar is
complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import llguidance

if TYPE_CHECKING:
    from radixcache.runtime.loading.tokenizer import Tokenizer

# llguidance's convention: a token whose bytes start with 0xFF is special and never matches text.
SPECIAL_PREFIX = b"\xff"


@dataclass(frozen=True, eq=False)
class GrammarVocab:
    """`lib`: the library's tokenizer; `vocab_size`: the width of a mask row (the model's logits width, which may
    exceed the tokenizer's); `stop_ids`: the tokens that end a completed grammar, the first being EOS."""

    lib: Any
    vocab_size: int
    stop_ids: tuple[int, ...]


class _Wrapped:
    """The duck-typed tokenizer `llguidance.TokenizerWrapper` reads. The library takes the ids it returns for text the
    grammar forces (`{"` of a JSON object) as that text's tokens and allows the first of them: they must stand for
    exactly that text's bytes. A SentencePiece tokenizer (Llama 2, Mistral 7B tokenizer.json) puts a "▁" before
    whatever it encodes, so `{` came back as "▁{" (" {"): the mask allowed a token the grammar then refused, and the
    request failed. Such text is tokenized greedily from the vocabulary instead (longest token first). So is text
    that holds a special token's text (`"<|im_end|>"` in a schema's `const`): the tokenizer encodes it as that
    special token, which never matches text, so the mask allowed a token the grammar refused."""

    def __init__(
        self, tokenizer: Tokenizer, tokens: list[bytes], special: list[int], eos: int, plain: list[bytes]
    ) -> None:
        self._tokenizer = tokenizer
        self.tokens = tokens
        self.special_token_ids = special
        self.eos_token_id = eos
        self.bos_token_id = tokenizer.bos_token_id
        self._plain = plain  # each token's bytes, specials without the marker
        self._by_bytes: dict[bytes, int] | None = None  # for `_greedy`, built at its first use
        self._longest = 0

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        want = text.encode("utf-8")  # never holds the special marker (0xFF is no UTF-8 byte)
        if b"".join(self.tokens[i] for i in ids) == want:
            return ids
        if ids and self.tokens[ids[0]] == b" " and b"".join(self.tokens[i] for i in ids[1:]) == want:
            return ids[1:]  # the prefix space was a token of its own
        return self._greedy(want) or ids

    def _greedy(self, data: bytes) -> list[int] | None:
        """`data` as the longest tokens that match it, left to right (ordinary tokens only); None where a byte is
        in no token (a vocabulary without byte tokens)."""
        if self._by_bytes is None:
            special = set(self.special_token_ids)
            by_bytes: dict[bytes, int] = {}
            for i, b in enumerate(self._plain):
                if b and i not in special:
                    by_bytes.setdefault(b, i)
            self._by_bytes, self._longest = by_bytes, max(map(len, by_bytes), default=0)
        ids, pos = [], 0
        while pos < len(data):
            for n in range(min(self._longest, len(data) - pos), 0, -1):
                token = self._by_bytes.get(data[pos : pos + n])
                if token is not None:
                    ids.append(token)
                    pos += n
                    break
            else:
                return None
        return ids


class TokenTable(NamedTuple):
    """What the vocabulary is made of, and all that is slow to read from a tokenizer (~0.2 s for SmolLM2's 49,152
    tokens): each token's bytes (`plain`, specials without the marker) and the ids of the special ones."""

    plain: tuple[bytes, ...]
    special: tuple[int, ...]


def token_table(tokenizer: Tokenizer) -> TokenTable:
    """`tokenizer`'s `TokenTable`, read token by token."""
    n_tok = tokenizer.vocab_size
    added = {i for i, t in tokenizer.backend.get_added_tokens_decoder().items() if t.special}
    added |= {i for i, j in getattr(tokenizer, "shadowed", {}).items() if j in added}  # a GGUF's repeated `<|im_end|>`
    special = sorted(i for i in added if i < n_tok)
    return TokenTable(tuple(tokenizer.token_bytes(i) for i in range(n_tok)), tuple(special))


def build_vocab(
    tokenizer: Tokenizer,
    *,
    vocab_size: int | None = None,
    stop_token_ids: Sequence[int] = (),
    table: TokenTable | None = None,
) -> GrammarVocab:
    """The grammar vocabulary of `tokenizer`. `vocab_size` is the model's logits width (default: the tokenizer's);
    ids past the tokenizer's vocabulary are never allowed. `stop_token_ids` are added to the model's EOS ids.
    `table`: `tokenizer`'s `TokenTable` where it is known already (vocab_cache.py's), else it is read."""
    n_tok = tokenizer.vocab_size
    width = max(int(vocab_size or n_tok), n_tok)
    stops = tuple(dict.fromkeys([*tokenizer.eos_token_ids, *(int(t) for t in stop_token_ids)]))
    if not stops:
        raise ValueError(f"{tokenizer!r} has no EOS token: a grammar needs one to end its output")
    plain, special = table if table is not None else token_table(tokenizer)
    special_set = set(special)
    tokens = [SPECIAL_PREFIX + raw if i in special_set else raw for i, raw in enumerate(plain)]
    wrapped = llguidance.TokenizerWrapper(_Wrapped(tokenizer, tokens, list(special), stops[0], list(plain)))
    lib = llguidance.LLTokenizer(wrapped, n_vocab=width, eos_token=list(stops))
    return GrammarVocab(lib=lib, vocab_size=width, stop_ids=stops)
