"""A Session's tool round trip on asyncio (tiny checkpoint, the generic tool format: only the grammar makes calls):
`asend_tool_results` against a full recompute of the same prompt, and a cancel while its reply decodes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from radixcache.runtime import Engine
from tests.runtime.structured.conftest import PAGE
from tests.runtime.structured.test_tools import ONE_CALL, check_calls


def test_an_async_session_tool_round_trip_is_what_a_full_recompute_gives(engine: Engine) -> None:
    """Session had `asend` but no async `send_tool_results`: an agent on asyncio blocked its event loop on the
    reply to its tool results (or went through asyncio.to_thread). `asend_tool_results` adds the tool turns and
    awaits the reply; cancelling the task awaiting it keeps neither the tool turns nor a reply."""
    s = engine.session(system="Use the tools.", **ONE_CALL, max_new_tokens=200, seed=1)
    none = {"tool_choice": "none"}

    async def agent() -> tuple[Any, list[dict[str, Any]], dict[str, str], Any]:
        r = await s.asend("What is 2 + 3?")
        check_calls(r)
        history, results = list(s.messages), {c.id: "5" for c in r.tool_calls}
        cut = asyncio.ensure_future(s.asend_tool_results(results, **none, max_new_tokens=2000, ignore_eos=True))
        while not any(q.output_ids for q in engine.scheduler.decoding):  # its reply is being generated
            await asyncio.sleep(0.01)
        cut.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cut
        assert s.messages == history and len(s.results) == 1  # neither the tool turns nor a reply
        return r, history, results, await s.asend_tool_results(results, **none, max_new_tokens=6)

    r, history, results, r2 = asyncio.run(asyncio.wait_for(agent(), 120))
    turns = [{"role": "tool", "tool_call_id": i, "content": text} for i, text in results.items()]
    assert s.messages == [*history, *turns, {"role": "assistant", "content": r2.text}]
    alone = engine.chat([*history, *turns], 6, **ONE_CALL | none, seed=1)  # the same prompt, recomputed
    assert r2.token_ids == alone.token_ids and r2.prompt_tokens == alone.prompt_tokens
    assert r2.cached_tokens >= (r.prompt_tokens + len(r.token_ids) - 1) // PAGE * PAGE  # the call's pages too
    assert engine.wait_idle(60) and engine.check()["locked_blocks"] == 0
