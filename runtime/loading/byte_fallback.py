"""Decoding byte-fallback runs a character at a time (Llama 2, Mistral 7B tokenizer.json: `<0xHH>` tokens).

The `tokenizers` library's ByteFallback decoder reads a run of consecutive byte tokens as one UTF-8 string and, when
that is not all UTF-8, shows the whole run as U+FFFD (one per byte): a bad byte after "日" in the same run turned
"日" into U+FFFD too, in a result, a stream, a stop string's search and `text_offset`. SentencePiece's own decoder
keeps each complete character and shows only the bad bytes as U+FFFD. `split_runs` cuts such a run into one run per
character and one per bad byte (an empty token between them, which the decoder reads as no text), so the same
decoder reads each piece as it would alone: the invariant is that the text is the decoder's texts of the pieces
joined, each bad byte one U+FFFD (the count the library gives it).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer as Backend


def byte_value(token: str) -> int | None:
    """The byte a `<0xHH>` token stands for; None for any other token."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


def _pieces(data: bytes) -> list[tuple[int, bool]]:
    """`data`'s pieces in order, as (length, whole): a complete UTF-8 character, or one byte no character takes."""
    out, i = [], 0
    while i < len(data):
        for n in (1, 2, 3, 4):
            try:
                data[i : i + n].decode("utf-8")  # UTF-8 is prefix-free: at most one n reads
            except UnicodeDecodeError:
                continue
            out.append((n, True))
            break
        else:
            out.append((1, False))
        i += out[-1][0]
    return out


def split_runs(tokens: Sequence[str]) -> list[str] | None:
    """`tokens` with an empty token between the pieces (`_pieces`) of every run of byte tokens that is not all UTF-8;
    None when every run is UTF-8 (the decoder reads them right as they are)."""
    out: list[str] = []
    changed, i = False, 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and byte_value(tokens[j]) is not None:
            j += 1
        if j == i:
            out.append(tokens[i])
            i += 1
            continue
        pieces = _pieces(bytes(byte_value(t) or 0 for t in tokens[i:j]))  # all byte tokens: the loop above
        if len(pieces) > 1 and not all(whole for _, whole in pieces):
            changed = True
            for k, (n, _) in enumerate(pieces):
                out.extend([""] if k else [])
                out.extend(tokens[i : i + n])
                i += n
        else:
            out.extend(tokens[i:j])
        i = j
    return out if changed else None


def reads_byte_fallback(backend: Backend) -> bool:
    """Whether `backend`'s decoder reads `<0xHH>` tokens as bytes (a ByteFallback step): "日" from its three bytes, and
    an empty token as no text."""
    decoder = backend.decoder
    if decoder is None or any(backend.token_to_id(f"<0x{b:02X}>") is None for b in (0xE6, 0x97, 0xA5)):
        return False
    try:
        return decoder.decode(["a", "<0xE6>", "<0x97>", "<0xA5>", "", "<0xE6>"]).endswith("a日\ufffd")
    except Exception:  # a decoder that cannot read these tokens: leave decoding to the library
        return False


def decode_split(backend: Backend, ids: Sequence[int], skip_special_tokens: bool, special: frozenset[int]) -> str:
    """`backend.decode(ids)`, but a byte-fallback run that is not all UTF-8 keeps its complete characters. The
    tokens are the ones the library decodes: ids it has no token for are dropped, and special ones (`special`) when
    `skip_special_tokens`."""
    tokens = []
    for i in ids:
        if skip_special_tokens and i in special:
            continue
        if (token := backend.id_to_token(i)) is not None:
            tokens.append(token)
    split = split_runs(tokens)
    if split is None:
        return backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
    return backend.decoder.decode(split)
