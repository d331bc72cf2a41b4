"""`dumps_in_pieces` (runtime.server.json_pieces) against Starlette's JSONResponse, the reference: the same bytes for
every value and the same refusals; and a worker thread encoding a whole response with logprobs (41 MB) lets the event
loop run, where `json.dumps` held the GIL for the whole call and the loop ran not at all meanwhile."""

from __future__ import annotations

import asyncio
import threading

import pytest
from fastapi.responses import JSONResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime.server.json_pieces import PIECE_ITEMS, PieceJSONResponse, dumps_in_pieces

keys = st.text(max_size=6) | st.integers(-5, 5) | st.booleans() | st.none() | st.floats(allow_nan=False)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=PIECE_ITEMS * 2 + 3)
        | st.tuples(inner, inner)
        | st.dictionaries(keys, inner, max_size=6)
        | st.dictionaries(st.text(max_size=6), inner, max_size=6)
    ),
    max_leaves=300,
)


@settings(max_examples=150, deadline=None)
@given(values)
def test_pieces_encode_every_value_as_json_response(value: object) -> None:
    try:
        expected = JSONResponse(value).body
    except ValueError:  # NaN or Infinity: refused the same way
        with pytest.raises(ValueError):
            dumps_in_pieces(value)
        return
    assert dumps_in_pieces(value) == expected


def _logprobs_response() -> dict:
    """The shape of a chat completion with n=16, 2,000 tokens and top_logprobs=20: 41 MB of JSON."""

    def alt(i: int) -> dict:
        return {"token": f"tok{i}", "logprob": -1.2345678 * i, "bytes": [116, 111, 107]}

    content = [{"token": "é", "logprob": -0.5, "bytes": [195, 169], "top_logprobs": [alt(i) for i in range(20)]}] * 2000
    choice = {"message": {"role": "assistant", "content": "é" * 2000}, "logprobs": {"content": content}}
    return {"id": "chatcmpl-1", "choices": [{"index": j, **choice} for j in range(16)], "usage": {"total_tokens": 1}}


@pytest.mark.slow  # 41 MB encoded
def test_the_loop_runs_while_a_worker_encodes_a_huge_response() -> None:
    body = _logprobs_response()
    started, ended = threading.Event(), threading.Event()

    def render() -> bytes:
        started.set()
        try:
            return PieceJSONResponse(body).body
        finally:
            ended.set()

    async def loop_turns() -> tuple[int, bytes]:
        work = asyncio.ensure_future(asyncio.to_thread(render))
        while not started.is_set():
            await asyncio.sleep(0)
        turns = 0
        while not ended.is_set():  # turns of the loop while the encoder runs: before, none (the GIL held throughout)
            await asyncio.sleep(0.001)
            turns += 1
        return turns, await work

    turns, rendered = asyncio.run(loop_turns())
    assert rendered == JSONResponse(body).body
    assert turns >= 50, turns  # before: 3 to 17, all before and after json.dumps's call
