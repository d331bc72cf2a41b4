"""The Python API checks a history's tool turns as /v1/chat/completions does (runtime.tools.tool_turns): a tool
message answering no call, a call answered twice, and calls left without results are a ToolTurnError (a ValueError
and ToolInputError) naming `messages[i].field` (of a list of chats: `messages[c][i].field`, chat c), from Engine.chat,
achat, fork, stream and pin/unpin alike; and the cache holds no lock after them (the fixture checks). Before, each was
rendered: the model read a result for no call, or went on as if a call had run. The histories agent frameworks send
still run: LangChain's (an assistant message with tool_calls, then one tool message per call), parallel calls
answered out of order, one assistant message per call with its result between them, a call the length limit cut
answered anyway or not at all."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.tools.errors import ToolInputError
from radixcache.runtime.tools.tool_turns import ToolTurnError, check_tool_turns
from tests.tool_turn_messages import AGAIN, ASK, CUT, call, calls, result

ADD = call("call_b", '{"a": 2, "b": 3}', "add")
BAD = [
    ("a result after a user message", [ASK, result("call_a")], "messages[1].tool_call_id", "preceeding message"),
    ("a result for an id no call has", [ASK, calls(call("call_a")), result("call_x")], "messages[2].tool_call_id", ""),
    (
        "a call answered twice",
        [ASK, calls(call("call_a")), result("call_a", "aborted"), result("call_a")],
        "messages[3].tool_call_id",
        "Duplicate value for 'tool_call_id' of 'call_a'",
    ),
    (
        "a call left unanswered, then a user message",
        [ASK, calls(call("call_a"), ADD), result("call_a"), AGAIN],
        "messages[1].tool_calls[1].id",
        "did not have response messages: call_b",
    ),
    ("calls ending the history", [ASK, calls(call("call_a"))], "messages[1].tool_calls[0].id", "call_a"),
]
GOOD = [
    ("LangChain's: calls, then a result each", [ASK, calls(call("call_a"), ADD), result("call_a"), result("call_b")]),
    ("parallel results out of order", [ASK, calls(call("call_a"), ADD), result("call_b", "5"), result("call_a")]),
    (
        "one message per call, results between",
        [ASK, calls(call("call_a")), result("call_a"), calls(ADD), result("call_b")],
    ),
    ("a cut call answered anyway", [ASK, calls(call("call_a", CUT)), result("call_a", "cut"), AGAIN]),
    ("a cut call not answered", [ASK, calls(call("call_a", CUT)), AGAIN]),
    ("a result as content parts", [ASK, calls(call("call_a")), result("call_a", [{"type": "text", "text": "3 C"}])]),
]


async def _read(stream: Any) -> list[Any]:
    return [delta async for delta in stream]


@pytest.mark.parametrize(("case", "messages", "where", "says"), BAD, ids=[b[0] for b in BAD])
def test_each_entry_point_refuses_a_stray_or_unanswered_tool_turn(
    engine: Engine, case: str, messages: list[dict[str, Any]], where: str, says: str
) -> None:
    def refused(run: Any, where: str = where) -> ToolTurnError:
        with pytest.raises(ToolTurnError) as info:
            run()
        assert info.value.path == where and str(info.value).startswith(f"{where}: ") and says in str(info.value)
        assert isinstance(info.value, ToolInputError) and isinstance(info.value, ValueError)
        return info.value

    err = refused(lambda: engine.chat(messages, 1))
    assert err.param == where.replace("[", ".").replace("]", "")  # the server's `param`: messages.1.tool_calls.0.id
    # a batch: the bad conversation refuses the call, named by its index in the list (it said only `messages[1]...`)
    refused(lambda: engine.chat([[ASK], messages], 1), "messages[1]" + where.removeprefix("messages"))
    refused(lambda: asyncio.run(engine.achat(messages, 1)))
    refused(lambda: engine.fork(messages, n=2, max_new_tokens=1))
    refused(lambda: asyncio.run(_read(engine.stream(messages, 1))))
    refused(lambda: engine.unpin(messages))
    assert engine.check()["locked_blocks"] == 0


@pytest.mark.parametrize(("case", "messages"), GOOD, ids=[g[0] for g in GOOD])
def test_agent_framework_histories_still_run(engine: Engine, case: str, messages: list[dict[str, Any]]) -> None:
    check_tool_turns(messages)
    assert engine.chat(messages, 1).finish_reason == "length"
    assert len(engine.fork(messages, n=2, max_new_tokens=1)) == 2


def test_a_bad_message_of_a_chat_batch_is_named_by_its_chat(engine: Engine) -> None:
    """Of a list of chats, a message's error names the chat too (`messages[2][0].role`), as a batch's prompt errors
    say `prompts[i]`; one chat alone is named as before, and nothing of the refused call runs."""
    robot, before = [{"role": "robot", "content": "beep"}], engine.stats.requests
    with pytest.raises(ToolInputError) as info:
        engine.chat([[ASK], [ASK], robot], 1)
    assert info.value.path == "messages[2][0].role" and str(info.value).startswith("messages[2][0].role: must be")
    with pytest.raises(ToolInputError) as info:
        engine.chat(robot, 1)
    assert info.value.path == "messages[0].role"
    assert engine.stats.requests == before and engine.check()["locked_blocks"] == 0


def test_a_session_turn_after_its_calls_are_answered_still_runs(engine: Engine) -> None:
    s = engine.session(system="Use the tools.", max_new_tokens=1)
    s.messages += [ASK, calls(call("call_a"), ADD), result("call_b", "5"), result("call_a")]
    assert s.send("Go on.").finish_reason == "length"
