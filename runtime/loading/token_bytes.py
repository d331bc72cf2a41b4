"""The bytes one token stands for, from its vocabulary string and its decoded text (logprobs' `bytes` and the grammar's
vocabulary read them): a token may stand for part of a UTF-8 character, which its decoded text cannot show."""

from __future__ import annotations

import contextlib
import functools


def spelled_bytes(raw: str, text: str) -> bytes:
    """The bytes of a token whose vocabulary string is `raw` and whose text, decoded alone, is `text`: a
    byte-fallback token `<0xHH>`, a byte-level (GPT-2 style) token read through the byte alphabet, a SentencePiece
    token with "▁" as the space (its decoder strips a leading space, so the decoded text of "▁1" alone is "1": a
    grammar then took "1" + "▁2" for "12"), else its decoded text."""
    if len(raw) == 6 and raw.startswith("<0x") and raw.endswith(">"):
        with contextlib.suppress(ValueError):
            return bytes([int(raw[3:5], 16)])
    table = unicode_to_byte()
    if raw and all(ch in table for ch in raw):
        candidate = bytes(table[ch] for ch in raw)
        if candidate.decode("utf-8", errors="replace") == text:
            return candidate
    if "\u2581" in raw and (spaced := raw.replace("\u2581", " ")).lstrip(" ") == text.lstrip(" "):
        return spaced.encode("utf-8")
    return text.encode("utf-8")


@functools.cache
def unicode_to_byte() -> dict[str, int]:
    """The byte-level BPE alphabet, inverted: printable Latin-1 bytes stand for themselves, every other byte for
    the character 256 + its rank among those others (the convention GPT-2 introduced and Llama 3, Qwen and SmolLM
    tokenizers share)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in set(printable)]
    table.update({chr(256 + i): b for i, b in enumerate(others)})
    return table
