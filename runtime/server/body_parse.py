"""Large request bodies parsed and validated off the event loop, in pieces that let the loop run between them.

FastAPI parses a body (`json.loads`) and validates it (pydantic) on the event loop. A body of tens of MiB (a 34 MiB
token-id prompt: 1.2 s of `json.loads`, 0.6 s of validation) stalled every other client's stream for that long.
A thread alone does not help: `json.loads` and pydantic-core each hold the GIL for their whole call, so the loop's
thread waits for them just the same. Here a body of at least `BIG_BODY_BYTES` is parsed in a worker thread by
`loads_in_pieces`, which runs the C decoder on pieces of at most about `PIECE_CHARS` characters and Python between
them (where the interpreter hands the GIL to the loop's thread when it asks), then validated there too (a token-id
list in pieces: runtime.server.protocol.TokenIds). At most `PARALLEL_PARSES` bodies are parsed at once per app; the
others wait for their turn without holding a thread. What the route then receives is the same value, and a body
that does not parse or validate gets the same 400 as a small one.
"""

from __future__ import annotations

import asyncio
import email.message
import json
from collections.abc import Callable, Coroutine
from json.decoder import JSONDecodeError, scanstring
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticKnownError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

BIG_BODY_BYTES = 256 << 10  # below this `json.loads` takes a few ms: parsed on the loop, as FastAPI does
PIECE_CHARS = 64 << 10  # the most characters the C decoder reads in one call (about 1 ms), give or take a value
PIECE_ITEMS = 1 << 16  # the most members of a long list validated in one call of pydantic-core (about 10 ms)
PARALLEL_PARSES = 2  # big bodies parsed at once per app (each holds a thread, and its parsed objects)
_FIRST_WINDOW = 1 << 10  # a container is first tried whole within this many characters, then 8x more, ...
_WS = " \t\n\r"
_MAX_WALK = 100  # containers nested deeper are read by the C scanner whole (two Python frames a level here)

_decoder = json.JSONDecoder()  # json.loads's own settings: strict strings, NaN and Infinity as floats
_scan = _decoder.scan_once  # the C scanner: one value at an index -> (value, end)


def loads_in_pieces(raw: bytes, piece: int = PIECE_CHARS) -> Any:
    """`json.loads(raw)`: the same value, the same bodies refused (a ValueError: JSONDecodeError for bad JSON, or an
    integer past Python's digit limit; RecursionError past its nesting), but no one call of the C decoder reads more
    than about `piece` characters (a string value or a number is read whole: those take microseconds per KiB)."""
    text = raw.decode(json.detect_encoding(raw), "surrogatepass")  # what json.loads does with bytes
    if text.startswith("\ufeff"):
        raise JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    pieces = _Pieces(text, piece)
    value, end = pieces.value(pieces.skip(0), 0)
    end = pieces.skip(end)
    if end != len(text):
        raise JSONDecodeError("Extra data", text, end)
    return value


class _Pieces:
    """One document's recursive descent: a container larger than the piece is walked here, element by element (an
    array's run of small elements in one C call); anything smaller is read by the C scanner whole."""

    def __init__(self, text: str, piece: int) -> None:
        self.s, self.piece = text, max(piece, 16)

    def skip(self, i: int) -> int:
        s = self.s
        while i < len(s) and s[i] in _WS:
            i += 1
        return i

    def value(self, i: int, depth: int) -> tuple[Any, int]:
        s = self.s
        c = s[i : i + 1]
        if c == '"':
            return scanstring(s, i + 1, True)
        if c not in ("[", "{") or depth >= _MAX_WALK:  # past _MAX_WALK levels the C scanner goes on (and refuses
            return self.scalar(i)  # nesting past its limit as json.loads does), not Python's recursion limit
        window = _FIRST_WINDOW
        while window < self.piece * 8:
            if i + window >= len(s):
                return self.scalar(i)  # the rest of the document is one piece: read it whole
            try:  # a container that ends within the window parses there as it would in the whole text
                value, end = _scan(s[i : i + window], 0)
                return value, i + end
            except (ValueError, StopIteration):  # cut by the window's end (or bad: found again below)
                window *= 8
        return self.array(i, depth + 1) if c == "[" else self.object(i, depth + 1)

    def scalar(self, i: int) -> tuple[Any, int]:
        try:
            return _scan(self.s, i)
        except StopIteration as e:  # where the value that is not one starts, maybe inside this one
            raise JSONDecodeError("Expecting value", self.s, e.value) from None

    def object(self, i: int, depth: int) -> tuple[dict[str, Any], int]:
        s, pairs, run = self.s, [], self.piece
        i = self.skip(i + 1)
        if s[i : i + 1] == "}":
            return {}, i + 1
        while True:
            batch, i, run = self.batch(i, run, "{", "}")
            if batch is not None:
                pairs += batch.items()  # in order: a key sent twice keeps its last value, as in json.loads
                continue
            if s[i : i + 1] != '"':
                raise JSONDecodeError("Expecting property name enclosed in double quotes", s, i)
            key, i = scanstring(s, i + 1, True)
            i = self.skip(i)
            if s[i : i + 1] != ":":
                raise JSONDecodeError("Expecting ':' delimiter", s, i)
            value, i = self.value(self.skip(i + 1), depth)
            pairs.append((key, value))
            i = self.skip(i)
            if s[i : i + 1] == "}":
                return dict(pairs), i + 1
            if s[i : i + 1] != ",":
                raise JSONDecodeError("Expecting ',' delimiter", s, i)
            i = self.skip(i + 1)

    def array(self, i: int, depth: int) -> tuple[list[Any], int]:
        s, items, run = self.s, [], self.piece
        i = self.skip(i + 1)
        if s[i : i + 1] == "]":
            return [], i + 1
        while True:
            batch, i, run = self.batch(i, run, "[", "]")
            if batch is not None:
                items += batch
                continue
            value, i = self.value(i, depth)
            items.append(value)
            i = self.skip(i)
            if s[i : i + 1] == "]":
                return items, i + 1
            if s[i : i + 1] != ",":
                raise JSONDecodeError("Expecting ',' delimiter", s, i)
            i = self.skip(i + 1)

    def batch(self, i: int, run: int, opening: str, closing: str) -> tuple[Any, int, int]:
        """The members from `i` up to the last comma within `run` characters, read as one container of their own
        (value, the index after that comma, the next run), or (None, i, a shorter run). Such a piece parses whole
        only when the comma is one of this container's: a comma inside a string or a nested value leaves the
        piece unbalanced, and one past this container's end leaves it with extra data."""
        cut = self.s.rfind(",", i, i + run) if run >= _FIRST_WINDOW else -1
        if cut <= i:
            return None, i, run
        part = opening + self.s[i:cut] + closing
        try:
            value, end = _scan(part, 0)
        except (ValueError, StopIteration):
            end = -1
        if end != len(part):
            return None, i, run // 4  # members too large for the run, or commas inside them: fewer, or one by one
        return value, self.skip(cut + 1), min(run * 2, self.piece)


def list_in_pieces(max_length: int) -> WrapValidator:
    """A list type's validator (`Annotated[list[X], Field(max_length=...), list_in_pieces(max_length)]`) that runs
    pydantic-core on pieces of PIECE_ITEMS members of a long list, so a thread validating a million token ids lets
    the loop run between pieces (and a list past `max_length` is refused before any member is validated: pydantic
    validates them all first, 3 s for 9 million). A list with an invalid member is validated again whole, for
    pydantic's errors under their own indices."""

    def validate(value: Any, whole: ValidatorFunctionWrapHandler) -> Any:
        if type(value) is not list or len(value) <= PIECE_ITEMS:
            return whole(value)
        if len(value) > max_length:
            raise PydanticKnownError(
                "too_long", {"field_type": "List", "max_length": max_length, "actual_length": len(value)}
            )
        out: list[Any] = []
        try:
            for start in range(0, len(value), PIECE_ITEMS):
                out += whole(value[start : start + PIECE_ITEMS])
        except ValidationError:
            return whole(value)
        return out

    return WrapValidator(validate)


def is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this Content-Type as JSON (application/json or application/*+json)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def off_loop_route(parallel: int = PARALLEL_PARSES) -> type[APIRoute]:
    """An APIRoute class (`FastAPI(...).router.route_class`) whose JSON bodies of at least BIG_BODY_BYTES are parsed
    (`loads_in_pieces`) and validated in a worker thread, at most `parallel` at once for the app using it. FastAPI
    then takes the validated model as the body (a model instance passes its validation as it is). A client gone
    before its body was whole gets 499 (Starlette's ClientDisconnect was a 500 and a traceback, or FastAPI's 400)."""
    turns = asyncio.Semaphore(parallel)

    class OffLoopRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler, field = super().get_route_handler(), self.body_field

            async def handle(request: Request) -> Response:
                if field is not None:
                    try:
                        raw = await request.body()
                    except ClientDisconnect:  # gone before its body was whole: no parse error, nor a bug (a 500)
                        raise HTTPException(499, "client disconnected") from None
                    if len(raw) >= BIG_BODY_BYTES and is_json(request.headers.get("content-type")):
                        async with turns:
                            request._json = await asyncio.to_thread(_parsed, raw, field)
                return await handler(request)

            return handle

    return OffLoopRoute


def _parsed(raw: bytes, field: Any) -> Any:
    """The body validated as `field` (FastAPI's ModelField), with FastAPI's own errors for a body that fails."""
    try:
        data = loads_in_pieces(raw)
    except JSONDecodeError as e:
        error = {"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**error, "ctx": {"error": e.msg}}], body=e.doc) from e
    except Exception as e:  # an integer past the digit limit, nesting past the recursion limit: as FastAPI says
        raise HTTPException(400, "There was an error parsing the body") from e
    value, errors = field.validate(data, {}, loc=("body",))
    if errors:
        raise RequestValidationError(errors, body=data)
    return value
