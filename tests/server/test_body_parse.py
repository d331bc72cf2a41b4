"""`loads_in_pieces` (runtime.server.body_parse) against `json.loads`, the reference: the same value for every
document, and a refusal (ValueError or RecursionError; bad JSON: the same message at the same position) for every
document json.loads refuses, with pieces small enough that every path (containers walked member by member, runs of
members read at once, windows) is taken."""

from __future__ import annotations

import json
import math
from json.decoder import JSONDecodeError

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime.server.body_parse import loads_in_pieces

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.sampled_from(["", ",", "]", "}", '"', "\\", "[1,2]", "{,}", "\ud800"])
)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=40) | st.dictionaries(st.text(max_size=8), inner, max_size=12),
    max_leaves=80,
)


def _same(raw: bytes, piece: int) -> None:
    try:
        expected = json.loads(raw)
    except (ValueError, RecursionError) as e:
        with pytest.raises(type(e) if isinstance(e, RecursionError) else ValueError) as got_error:
            loads_in_pieces(raw, piece)
        if isinstance(e, JSONDecodeError):  # the same message at the same place (FastAPI's loc: ("body", pos))
            assert (got_error.value.msg, got_error.value.pos) == (e.msg, e.pos)
        return
    got = loads_in_pieces(raw, piece)
    assert json.dumps(got) == json.dumps(expected)  # NaN-safe, and dict order compared too


@settings(max_examples=100, deadline=None)
@given(documents, st.sampled_from([16, 40, 200, 1 << 16]), st.sampled_from([None, 0, 1]), st.booleans())
def test_pieces_parse_every_document_as_json_loads(doc: object, piece: int, indent: int | None, ascii: bool) -> None:
    _same(json.dumps(doc, indent=indent, ensure_ascii=ascii).encode("utf-8", "surrogatepass"), piece)


@settings(max_examples=100, deadline=None)
@given(documents, st.integers(0, 10**6), st.sampled_from(["", ",", "]", "}", "x", '"', "{", "[", " ", "\\", ":"]))
def test_pieces_refuse_what_json_loads_refuses(doc: object, at: int, junk: str) -> None:
    text = json.dumps(doc)
    cut = at % (len(text) + 1)
    for broken in (text[:cut] + junk + text[cut:], text[:cut] + text[cut + 1 :]):
        _same(broken.encode("utf-8", "surrogatepass"), 16)


def test_pieces_of_large_documents() -> None:
    ids = [[i * 7919 % 50_000 for i in range(30_000)] for _ in range(3)]
    messages = [{"role": "user", "content": "x, ]}" * 9000 + str(i)} for i in range(20)]
    for doc in ({"model": "m", "prompt": ids}, {"messages": messages, "n": 1}, {"a": {"b": ids[0], "c": math.pi}}):
        for raw in (json.dumps(doc).encode(), json.dumps(doc, indent=2).encode("utf-16")):
            _same(raw, 1 << 10)
            _same(raw, 1 << 16)
    deep = b"[" * 5000 + b"1" + b"]" * 5000  # past the recursion limit, for json.loads and the pieces alike
    _same(b"[" * 600 + json.dumps(ids[0]).encode() + b"]" * 600, 1 << 10)  # deep, within json.loads's limit
    _same(deep, 16)
    _same(b"[" * 500 + b'"' + b"x" * 100 + b'"' + b"]" * 500, 16)  # within json.loads's nesting, past the walk's
    _same(b"\xef\xbb\xbf[1, 2]", 16)  # a UTF-8 BOM: json.loads reads bytes with one
    _same(b'{"a": 1, "a": 2, "b": [1, 2, 3], "a": 3}', 16)  # a key sent twice keeps its last value
    for bad in (b"[ull", b'{"a": [1, 2, tru]}', b"[\n1e+300,\n,rue\n]"):  # a bad value inside a container
        _same(bad, 16)
        _same(bad, 1 << 16)  # read whole by the C scanner: its error's own position, not the container's
    _same(b"[NaN, Infinity, -Infinity, 1e400, " + b"9" * 5000 + b"]", 16)  # past the digit limit: a ValueError


SAME_ANSWERS = [
    ("/v1/completions", '{"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0}'),
    (
        "/v1/chat/completions",
        '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}',
    ),
    ("/v1/responses", '{"model": "tiny", "input": "hi", "max_output_tokens": 16, "temperature": 0}'),
    ("/v1/completions", '{"model": "tiny", "prompt": [1, 2,]}'),  # not JSON
    ("/v1/completions", '{"model": "tiny", "prompt": [1, -2]}'),
    ("/v1/completions", '{"model": "tiny", "prompt": [1, 2], "frobnicate": 1}'),
    ("/v1/completions", '{"model": "tiny", "prompt": "x", "temperature": NaN}'),
    ("/v1/completions", '{"model": "tiny", "prompt": [' + "9" * 5000 + "]}"),  # past Python's digit limit
    ("/v1/completions", '{"model": "tiny", "prompt": ' + "[" * 3000 + "]" * 3000 + "}"),  # past the recursion limit
    ("/v1/completions", '{"model": "other", "prompt": "x"}'),
    ("/v1/completions", '{"model": 5, "prompt": "x"}'),
    ("/v1/chat/completions", "[1, 2]"),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}'),
]


@pytest.fixture(scope="module")
def tiny_client(tmp_path_factory: pytest.TempPathFactory):
    from tests.server.keyed_tiny import tiny_client

    with tiny_client(tmp_path_factory, "body_parse") as client:
        yield client


@pytest.mark.parametrize(("path", "body"), SAME_ANSWERS)
def test_a_big_body_is_answered_as_the_same_body_small(tiny_client, path: str, body: str) -> None:
    """The body as sent (parsed on the loop, by FastAPI) and padded with spaces past BIG_BODY_BYTES (parsed and
    validated in a worker thread): the same status, the same error, the same text."""
    from radixcache.runtime.server.body_parse import BIG_BODY_BYTES

    padded = body[0] + " " * BIG_BODY_BYTES + body[1:]
    answers = []
    for raw in (body, padded):
        r = tiny_client.post(path, content=raw.encode(), headers={"content-type": "application/json"})
        data = r.json()
        kept = data.get("error") or data.get("choices") or [item.get("content") for item in data.get("output", [])]
        answers.append((r.status_code, kept))
    assert answers[0] == answers[1]
