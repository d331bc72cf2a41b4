"""Large JSON responses encoded in pieces, so a worker thread encoding one lets the event loop run meanwhile.

A whole response with logprobs (n=16 x 2,000 tokens x 20 alternatives: 41 MB of JSON) is built and encoded in a
worker thread (runtime.server.app), but `json.dumps` holds the GIL for its whole call: 0.5-2.6 s on this machine,
during which the loop's thread could not run and every stream and /health waited. `dumps_in_pieces` gives
Starlette's JSONResponse bytes, encoding a dict's values one at a time and a long list `PIECE_ITEMS` members at a
time, so no one call of the C encoder holds the GIL for long; `PieceJSONResponse` is a JSONResponse that renders so.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

WALK_DEPTH = 5  # containers this deep are encoded by pieces of members, not member by member
PIECE_ITEMS = 64  # members of a long list encoded in one call (64 tokens' logprobs with 20 alternatives: ~80 KB)
_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode  # JSONResponse's


def dumps_in_pieces(content: Any) -> bytes:
    """`JSONResponse(content).body`: the same bytes, the same errors (NaN, a value JSON has no form for)."""
    parts: list[str] = []
    _pieces(content, parts, 0)
    return "".join(parts).encode("utf-8")


def _pieces(value: Any, parts: list[str], depth: int) -> None:
    """`value` encoded into `parts`: containers down to WALK_DEPTH member by member (a response's choices, their
    logprobs, a logprobs list's tokens), deeper ones PIECE_ITEMS members at a time (a token's alternatives)."""
    walk = depth < WALK_DEPTH
    if walk and isinstance(value, dict) and value and all(type(k) is str for k in value):
        parts.append("{")
        for i, (key, member) in enumerate(value.items()):
            parts.append(("," if i else "") + _encode(key) + ":")
            _pieces(member, parts, depth + 1)
        parts.append("}")
    elif isinstance(value, (list, tuple)) and value and (walk or len(value) > PIECE_ITEMS):
        parts.append("[")
        for start in range(0, len(value), PIECE_ITEMS):
            piece = value[start : start + PIECE_ITEMS]
            if walk and any(isinstance(member, (dict, list, tuple)) for member in piece):
                for i, member in enumerate(piece):
                    parts.append("," if start or i else "")
                    _pieces(member, parts, depth + 1)
            else:
                parts.append(("," if start else "") + _encode(list(piece))[1:-1])
        parts.append("]")
    else:  # a scalar, a short or deep list, a dict with a key JSON spells otherwise: the encoder's own
        parts.append(_encode(value))


class PieceJSONResponse(JSONResponse):
    """A JSONResponse rendered by `dumps_in_pieces`: build it in a worker thread."""

    def render(self, content: Any) -> bytes:
        return dumps_in_pieces(content)
