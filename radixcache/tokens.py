"""Token sequences as compact int64 arrays, and the prefix comparison the tree walk relies on."""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from functools import lru_cache

from radixcache.errors import InvalidTokensError

TOKEN_TYPECODE = "q"  # int64: token ids and 64-bit trace hash ids both fit
# The byte of each int64 that holds its sign bit. `isascii` over those bytes (one per token) finds a negative
# token at C speed, where `min(arr) < 0` would box every token into a Python int.
SIGN_BYTE = 7 if sys.byteorder == "little" else 0
LOW_BYTE = 7 - SIGN_BYTE  # the byte of each int64 that holds its lowest 8 bits


def as_token_array(tokens: Sequence[int] | array) -> array:
    """Validate `tokens` and return them as an int64 array (a fresh copy, never an alias of the input).

    Raises InvalidTokensError for non-integers (floats, strings, None, bools: True is an int to Python, and was
    taken as token 1), negative ids or ids over 2**63-1. The conversion and the range check run at C speed, so
    validation is cheap on the hot path; so does the search for bools (`_refuse_bools`).
    """
    if type(tokens) is array and tokens.typecode == TOKEN_TYPECODE:  # already int64: a copy, then the sign check
        arr = array(TOKEN_TYPECODE, tokens)
        if arr.tobytes()[SIGN_BYTE::8].isascii():
            return arr
        index = next(i for i, t in enumerate(arr) if t < 0)
        raise InvalidTokensError(f"tokens must be non-negative: token {index} is {arr[index]}")
    if isinstance(tokens, (str, bytes, bytearray)):
        raise InvalidTokensError(f"tokens must be a sequence of ints, got {type(tokens).__name__}")
    try:
        if type(tokens) is not list and type(tokens) is not tuple and not isinstance(tokens, (array, range)):
            tokens = list(tokens)  # any other iterable (a generator, a deque) may hold bools: read once, checked below
        if type(tokens) is list or type(tokens) is tuple:  # struct packs ints about twice as fast as array()
            raw = int64_packer(len(tokens))(*tokens)
        else:  # an array of another typecode, or a range: ints only
            raw = array(TOKEN_TYPECODE, tokens).tobytes()
    except (TypeError, OverflowError, struct.error) as exc:
        bad = _first_bad_token(tokens)
        raise InvalidTokensError(f"tokens must be non-negative ints below 2**63: {bad}") from exc
    if not raw[SIGN_BYTE::8].isascii():  # a sign bit set: some token is negative
        index = next(i for i, t in enumerate(tokens) if t < 0)
        raise InvalidTokensError(f"tokens must be non-negative: token {index} is {tokens[index]}")
    low = raw[LOW_BYTE::8]  # a bool packs as 0 or 1: only a token whose low byte is 0 or 1 can be one
    if b"\x00" in low or b"\x01" in low:
        _refuse_bools(tokens, low)
    return array(TOKEN_TYPECODE, raw)


def _refuse_bools(tokens: Sequence[int], low: bytes) -> None:
    """Raise InvalidTokensError naming the first bool of `tokens`, whose int64s' low bytes are `low`."""
    first = first_bool(tokens, low)
    if first is not None:
        raise InvalidTokensError(f"tokens must be ints, not bools: token {first} is {tokens[first]!r}")


def first_bool(values: Sequence[object], low: bytes) -> int | None:
    """The index of the first bool in `values` (a list or tuple of ints), given `low`, the low byte of each as an
    int64 (`packed[LOW_BYTE::8]`); else None. True is an int to Python (packed as 1), never a token or block id.

    Only the values whose low byte is 0 or 1 are looked at, found at C speed (1 in 30 to 1 in 128 of a real prompt's):
    a type check of every value doubled the conversion's cost.
    """
    first = len(low)
    for byte in (b"\x00", b"\x01"):
        index = low.find(byte, 0, first)
        while index != -1:
            if type(values[index]) is bool:
                first = index
                break
            index = low.find(byte, index + 1, first)
    return first if first < len(low) else None


@lru_cache(maxsize=4096)
def int64_packer(n: int) -> Callable[..., bytes]:
    """The packer of n int64s, compiled once per length (struct's own format cache costs a format and a lookup)."""
    return struct.Struct(f"{n}{TOKEN_TYPECODE}").pack


def token_view(tokens: Sequence[int] | array) -> array:
    """`as_token_array`, except that a valid int64 array comes back as itself, uncopied.

    For callers that only read the tokens during the call and keep slices (always copies), never the array:
    the cache's match and insert. The same errors as `as_token_array`.
    """
    if type(tokens) is array and tokens.typecode == TOKEN_TYPECODE and tokens.tobytes()[SIGN_BYTE::8].isascii():
        return tokens
    return as_token_array(tokens)


def check_signs(arr: array, start: int = 0, raw: bytes | None = None) -> None:
    """Raise InvalidTokensError, as `token_view` would, if a token of the int64 array `arr` from `start` on is negative.

    For a caller that has already proven `arr[:start]` non-negative, e.g. by finding it equal to tokens the tree
    holds (every one of them was checked on the way in), so that only the rest needs the check. `raw` is
    `arr.tobytes()` if the caller has it.
    """
    if raw is None:
        ok = (arr[start:] if start else arr).tobytes()[SIGN_BYTE::8].isascii()
    else:
        ok = raw[start * 8 + SIGN_BYTE :: 8].isascii()
    if not ok:
        raise InvalidTokensError(negative_token(arr, start))


def negative_token(arr: array, start: int = 0) -> str | None:
    """The error message for the first negative token of the int64 array `arr` from `start` on, or None."""
    if (arr[start:] if start else arr).tobytes()[SIGN_BYTE::8].isascii():
        return None
    index = next(i for i in range(start, len(arr)) if arr[i] < 0)
    return f"tokens must be non-negative: token {index} is {arr[index]}"


def _first_bad_token(tokens: object) -> str:
    try:
        for index, token in enumerate(tokens):  # type: ignore[call-overload]
            if not hasattr(token, "__index__") or isinstance(token, bool):
                return f"token {index} is {token!r} ({type(token).__name__})"
            if token.__index__() >= 2**63 or token.__index__() < 0:
                return f"token {index} is {token!r} (out of range)"
    except TypeError:
        return f"{type(tokens).__name__} is not iterable"
    return "unconvertible token"


def common_prefix_length(key: array, tokens: array, start: int) -> int:
    """Length of the common prefix of `key` and `tokens[start:]`.

    The fast path is one C-level slice comparison (a full match, the common case along a path). A mismatch
    is located by binary search over slice equality, so a long key costs O(log n) C-speed comparisons
    instead of a Python loop per token.
    """
    limit = min(len(key), len(tokens) - start)
    if limit <= 0:
        return 0
    if (key if limit == len(key) else key[:limit]) == tokens[start : start + limit]:
        return limit
    if key[0] != tokens[start]:
        return 0
    lo, hi = 1, limit - 1  # invariant: first lo tokens equal, first hi+1 tokens differ somewhere
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if key[lo:mid] == tokens[start + lo : start + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
