"""The asyncio side of the Python API: why a stream ended."""

from __future__ import annotations

import asyncio

from radixcache.runtime import Engine
from radixcache.runtime.testing import RandomModel

from .conftest import assert_clean


def test_a_stream_says_why_it_ended_finished_cut_by_close_or_timed_out(tiny: RandomModel) -> None:
    """A stream cut by close() or its timeout ended like one that finished: nothing told its reader why. Its
    `result` is the request's GenerationResult and `finish_reason` says why, as generate's results do."""
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    want = engine.generate("stream me", 12, ignore_eos=True)

    async def read(**kw: object) -> tuple[str, object]:
        s = engine.stream("stream me", 12, ignore_eos=True, **kw)
        assert s.result is None and s.finish_reason is None
        return "".join([d async for d in s]), s

    text, s = asyncio.run(read())
    assert text == want.text and s.finish_reason == "length" and s.result.token_ids == want.token_ids
    _, s = asyncio.run(read(timeout=1e-9))  # past its deadline at the first step
    assert s.finish_reason == "timeout" and s.result.token_ids == ()
    assert_clean(engine)

    async def cut_by_close() -> tuple[str, object]:
        s = engine.stream("go on and on", 400, ignore_eos=True)
        shown = ""
        async for d in s:
            shown += d
            if engine.close() is not None and len(shown) > 400:  # close() cancels it at once
                raise AssertionError("the stream went on after close()")
        return shown, s

    shown, s = asyncio.run(cut_by_close())
    assert s.finish_reason == "cancelled" and s.result.text == shown and 0 < len(s.result.token_ids) < 400
