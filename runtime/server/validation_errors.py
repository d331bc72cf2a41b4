"""How a refused request body reads: pydantic's (or FastAPI's) errors as one line naming the field's path
(`validation_message`), Starlette's refusals (`refusal`) and a body refused as a whole (`body_message`), in OpenAI's
words where it has them ("Unrecognized request argument supplied: X")."""

from __future__ import annotations

import re
from typing import Any


def _path(loc: Any) -> str | None:
    """A field's path from an error location: "body", a query parameter's "query" and the union branch tags
    ("constrained-str", "list[int]", ...) dropped, list indices kept ("messages.0.role", "limit")."""
    loc = tuple(loc)[1:] if tuple(loc)[:1] == ("query",) else loc
    keep = [str(p) for p in loc if p != "body" and not (isinstance(p, str) and _UNION_TAG.fullmatch(p))]
    return ".".join(keep) or None


_UNION_TAG = re.compile(r"(constrained-)?(str|int|float|bool|dict|list|literal|function-\w+)(\[.*\])?")


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One readable line and the offending parameter (its path) from pydantic's (or FastAPI's) error list. Of a
    union's errors for one field, one that is not only "wrong type" is preferred (it says what was out of range)."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "We could not parse the JSON body of your request.", None
    top = _path(first.get("loc", ()))
    field = (top or "").split(".")[0]
    same = [e for e in errors if (_path(e.get("loc", ())) or "").split(".")[0] == field]
    err = next((e for e in same if not str(e.get("type", "")).endswith(("_type", "_parsing"))), first)
    param = _path(err.get("loc", ()))
    if err.get("type") == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}", param
    msg = err.get("msg", "invalid value")
    return (f"{param}: {msg}" if param else msg), param


def refusal(status: int, detail: str, content_encoding: str | None) -> tuple[int, str]:
    """The status and message for one of Starlette's refusals. Its 400 is a body FastAPI could not decode as JSON,
    whose detail ("There was an error parsing the body") says less than ours; a compressed body (`Content-Encoding:
    gzip`, which some HTTP clients send on request) is then a 415 that says so: the server decodes no content
    coding, and "could not parse the JSON body" sent its client looking for a fault in JSON it had built right."""
    if status != 400:
        return status, detail
    coding = (content_encoding or "").strip()
    if coding and coding.lower() != "identity":
        return 415, f"Content-Encoding: {coding} is not supported: send the JSON body uncompressed."
    return 400, "We could not parse the JSON body of your request."


def body_message(error: dict[str, Any], content_type: str | None) -> str | None:
    """The 400's message when the body as a whole is refused (pydantic's error at location ("body",)), else None:
    FastAPI reads a body as JSON only under a JSON Content-Type and passes any other on as bytes (`curl -d` sends
    form-encoded unless told), so "Input should be a valid dictionary" there meant a missing header."""
    if tuple(error.get("loc", ())) != ("body",):
        return None
    if isinstance(error.get("input"), bytes):
        sent = f"Content-Type: {content_type}" if content_type else "no Content-Type"
        return f"The request body must be JSON sent with Content-Type: application/json; this one had {sent}."
    if error.get("type") == "missing":
        return "The request body is empty: send a JSON object."
    if error.get("type") in ("model_attributes_type", "model_type", "dict_type"):
        return "The request body must be a JSON object."
    return None  # a check of the whole object (a model validator): its own message
