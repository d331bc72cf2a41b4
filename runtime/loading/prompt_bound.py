"""How many bytes of text a prompt of fewer than `context` tokens can hold, known before it is tokenised.

A prompt past the context is refused, but only once tokenised, and a body may carry 64 MiB of text: tokenising 16 MB
took 48 s here, during which the tokenizer held the GIL, so /health and every stream waited as long, for a 400.
When each token of a tokenizer stands for a piece of the text's own UTF-8 bytes (no normalizer, no pre-tokenizer that
drops what it splits on, no run of unknown characters fused into one token, no added token that strips the
whitespace beside it, no character dropped for want of an unknown token or byte fallback), a text of B bytes has at
least B / L tokens, L the most bytes any token holds: one of more than (context - 1) * L bytes cannot fit, and is
refused without being tokenised. Any other tokenizer gets no bound (None): only tokenising it tells. The server
(runtime.server.jobs: a 400) and the engine's request builder (a ValueError, for the Python API) both apply it.
"""

from __future__ import annotations

import json
from typing import Any

# pre-tokenizers that split text without dropping any of it (a Split whose behaviour is "removed" drops its matches,
# BERT's Whitespace drops the spaces); Metaspace replaces a space by "▁", which is longer
_KEEPS_TEXT = frozenset({"ByteLevel", "Digits", "Metaspace", "Punctuation", "Split", "UnicodeScripts", "Sequence"})
MIN_TOKEN_BYTES = 4  # an unknown character (one token each, unfused) holds up to 4 bytes


def token_bytes_bound(tokenizer: Any) -> int | None:
    """The most UTF-8 bytes one token of `tokenizer` stands for, or None when its tokens may stand for less than
    the text they cover (see the module's docstring)."""
    backend = getattr(tokenizer, "backend", None)
    token_bytes = getattr(tokenizer, "token_bytes", None)
    if backend is None or token_bytes is None or not hasattr(backend, "to_str"):
        return None
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    if spec.get("normalizer") is not None or model.get("type") != "BPE" or model.get("fuse_unk"):
        return None
    if not _keeps_text(spec.get("pre_tokenizer")):
        return None
    if any(t.get("lstrip") or t.get("rstrip") for t in spec.get("added_tokens") or ()):
        return None  # an added token that strips swallows the whitespace beside it: one token, any length
    if model.get("unk_token") is None and not model.get("byte_fallback") and not _byte_level(spec["pre_tokenizer"]):
        return None  # a character the vocabulary lacks, no unknown token, no bytes to fall back on: dropped
    ids = backend.get_vocab(with_added_tokens=True).values()  # not range(vocab size): ids may have holes
    longest = max((len(token_bytes(i)) for i in ids), default=0)
    return max(longest, MIN_TOKEN_BYTES)


def _keeps_text(pre: Any) -> bool:
    if pre is None:
        return True
    if not isinstance(pre, dict) or pre.get("type") not in _KEEPS_TEXT:
        return False
    if pre["type"] == "Split" and str(pre.get("behavior", "")).lower() == "removed":
        return False
    return all(_keeps_text(p) for p in pre.get("pretokenizers", ()))


def _byte_level(pre: Any) -> bool:
    """Whether the pre-tokenizer maps the text to bytes first (every character then has tokens)."""
    if not isinstance(pre, dict):
        return False
    return pre.get("type") == "ByteLevel" or any(_byte_level(p) for p in pre.get("pretokenizers", ()))


def may_be_too_long(text: str, context: int) -> bool:
    """Whether `text` may pass some tokenizer's bound under `context`: one of at most (context - 1) * MIN_TOKEN_BYTES
    bytes passes none (every bound is at least that many bytes a token), so the bound, whose first reckoning reads
    the whole vocabulary (0.5 s for SmolLM2's, the GIL held), is not needed for it."""
    most = (context - 1) * MIN_TOKEN_BYTES
    return len(text) * 4 > most and len(text.encode("utf-8", "surrogatepass")) > most  # 4 bytes a character at most


def too_long(text: str, context: int, per_token: int | None) -> int | None:
    """The UTF-8 length of `text` when it cannot fit under `context` tokens of at most `per_token` bytes each, else
    None (and None without a bound)."""
    if per_token is None or len(text) <= (context - 1) * per_token // 4:  # 4 bytes a character at most
        return None
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > (context - 1) * per_token else None
