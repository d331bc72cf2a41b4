"""A Hugging Face `tokenizers` backend built from GGUF tokenizer metadata (byte-level BPE vocabularies).

llama.cpp stores a BPE vocabulary as `tokenizer.ggml.tokens` (byte-level strings, "Ġ" for a space), `merges`
("a b", in rank order) and `token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte). How text
is split before BPE is not stored as a regex but named by `tokenizer.ggml.pre`; the table below maps each
supported name to the equivalent `tokenizers` pre-tokeniser.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4

# GPT-2's split: contractions, letters, numbers, punctuation runs, whitespace (the regex of ByteLevel(use_regex=True)).
_GPT2 = ("default", "gpt-2", "gpt2", "olmo", "jais")
# GPT-2's split after isolating every digit: StarCoder's tokenizer, reused by SmolLM/SmolLM2.
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact")
# Llama 3 and Qwen2 split with one regex; they differ only in how many digits a number chunk may hold.
_LLAMA3_LIKE = {
    "llama-bpe": r"\p{N}{1,3}",
    "llama3": r"\p{N}{1,3}",
    "qwen2": r"\p{N}",
    "deepseek-r1-qwen": r"\p{N}",
}
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|{digits}"
    r"| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SUPPORTED_PRE = (*_GPT2, *_DIGITS_THEN_GPT2, *_LLAMA3_LIKE)
# Llama 3's vocabulary came from tiktoken, which takes a whole pre-tokenised word that is itself a token before
# any merge: llama.cpp sets ignore_merges for these names, as Llama 3's tokenizer.json does ("ignore_merges": true),
# and prepends BOS unless the file says otherwise (gguf_model.gguf_adds_bos).
LLAMA3_PRE = ("llama-bpe", "llama3")


class UnsupportedTokenizerError(NotImplementedError, ValueError):
    """A GGUF vocabulary of a kind the runtime does not build. A ValueError too: the file's fault, which a caller
    reports as such (the CLI's one-line error), not a bug of the runtime."""


def pre_tokenizer_for(pre: str) -> pre_tokenizers.PreTokenizer:
    """The `tokenizers` pre-tokeniser equivalent to llama.cpp's named pre-tokeniser `pre`."""
    if pre in _GPT2:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in _LLAMA3_LIKE:
        regex = _LLAMA3_REGEX.format(digits=_LLAMA3_LIKE[pre])
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise UnsupportedTokenizerError(
        f"GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(SUPPORTED_PRE)})"
    )


def backend_from_gguf(meta: dict[str, Any], where: str = "GGUF metadata") -> Backend:
    """A `tokenizers.Tokenizer` equivalent to the GGUF file's vocabulary (byte-level BPE only). ValueError naming
    `where` (the file) and the key for a vocabulary of the wrong kind, type or length."""
    kind = meta.get("tokenizer.ggml.model")
    if not isinstance(kind, str) or kind != "gpt2":  # an array's != is an array, whose truth is a numpy error
        raise UnsupportedTokenizerError(
            f"{where}: GGUF tokenizer model {kind!r} is not supported; only byte-level BPE ('gpt2') vocabularies are"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if not isinstance(pre, str) or pre not in SUPPORTED_PRE:
        raise UnsupportedTokenizerError(
            f"{where}: GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(SUPPORTED_PRE)})"
        )
    tokens = _strings(meta, "tokenizer.ggml.tokens", where)
    if not tokens:
        raise ValueError(f"{where}: GGUF metadata tokenizer.ggml.tokens is missing or empty")
    merge_lines = _strings(meta, "tokenizer.ggml.merges", where)
    if any(" " not in m for m in merge_lines):
        raise ValueError(f"{where}: GGUF metadata tokenizer.ggml.merges holds a merge without a space")
    merges = [tuple(m.split(" ", 1)) for m in merge_lines]
    types = _integers(meta, "tokenizer.ggml.token_type", where)
    if types is not None and len(types) != len(tokens):
        raise ValueError(
            f"{where}: GGUF metadata tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens"
        )
    vocab = {tok: i for i, tok in enumerate(tokens)}  # a repeated string encodes to its last id (`shadowed_ids`)
    try:
        bpe = models.BPE(
            vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=pre in LLAMA3_PRE
        )
    except Exception as e:  # tokenizers raises a plain Exception for a merge of (or into) a string not in tokens
        raise ValueError(
            f"{where}: GGUF metadata tokenizer.ggml.merges does not fit tokenizer.ggml.tokens ({e})"
        ) from None
    backend = Backend(bpe)
    backend.pre_tokenizer = pre_tokenizer_for(pre)
    backend.decoder = decoders.ByteLevel()
    if types is not None:
        special, user = [], []
        for i, t in enumerate(types):
            if t == TOKEN_CONTROL:
                special.append(AddedToken(tokens[i], special=True, normalized=False))
            elif t == TOKEN_USER_DEFINED:
                user.append(AddedToken(tokens[i], special=False, normalized=False))
        backend.add_special_tokens(special)
        backend.add_tokens(user)
    return backend


def shadowed_ids(meta: dict[str, Any], where: str = "GGUF metadata") -> dict[int, int]:
    """Each id whose string a later id of `tokenizer.ggml.tokens` repeats, mapped to the last id with that string.
    llama.cpp's vocabulary load sets `token_to_id[text] = i` in id order, so such text encodes to the last id (as
    here: a BPE model maps a string to one id); the earlier ids are still the model's tokens, and decode to their
    own text through the id they map to (a sampled one decoded to '')."""
    tokens = _strings(meta, "tokenizer.ggml.tokens", where)
    last = {tok: i for i, tok in enumerate(tokens)}
    return {i: last[tok] for i, tok in enumerate(tokens) if last[tok] != i}


def _strings(meta: dict[str, Any], key: str, where: str) -> list[str]:
    """An array-of-strings metadata value ([] when absent); ValueError naming the key for anything else."""
    value = meta.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: GGUF metadata {key} is not an array of strings")
    return value


def _integers(meta: dict[str, Any], key: str, where: str) -> list[int] | None:
    """An array-of-integers metadata value (None when absent); ValueError naming the key for anything else."""
    value = meta.get(key)
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        return value.tolist()
    if value is None or (isinstance(value, list) and all(type(v) is int for v in value)):
        return value
    raise ValueError(f"{where}: GGUF metadata {key} is not an array of integers")
