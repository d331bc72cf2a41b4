"""Replies a client sent back split, joined again: some clients send a reply's parallel calls back as one assistant
message per call, and the server's Responses input turns items sent as call, output, call, output into such
messages with each call's result between them. The memory knows a reply by all its call ids together
(runtime/tools/memory.py), so each piece missed it, the calls re-rendered as separate turns, and the next prompt no
longer extended the cached prompt and output.

A run of messages is joined only when the memory holds a reply whose ids are exactly the run's calls, in order, and
that reply matches them (ids, names, arguments and the first message's content, as any lookup): the model then wrote
these calls as one reply before it saw any result, which is what the joined history says. The run is an assistant
message with calls, then assistant messages with calls and no content (under the same name) and tool messages
answering calls already in the run; the results keep their order, after the joined reply.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixcache.runtime.tools.memory import ToolCallMemory
from radixcache.runtime.tools.messages import ChatMessage, ToolCall


def joined_replies(messages: Sequence[ChatMessage], memory: ToolCallMemory | None) -> Sequence[ChatMessage]:
    """`messages` with each split reply the memory knows joined into one assistant message, its results after it."""
    if memory is None:
        return messages
    out: list[ChatMessage] = []
    i = 0
    while i < len(messages):
        joined = _joined_at(messages, i, memory)
        if joined is None:
            out.append(messages[i])
            i += 1
        else:
            reply, results, i = joined
            out += [reply, *results]
    return out


def _joined_at(
    messages: Sequence[ChatMessage], i: int, memory: ToolCallMemory
) -> tuple[ChatMessage, list[ChatMessage], int] | None:
    """The reply joined from the run starting at `messages[i]`, its results, and the index past the run; or None."""
    first = messages[i]
    if first.role != "assistant" or not first.tool_calls:
        return None
    ids = memory.reply_ids(first.tool_calls[0].id)
    if ids is None or len(ids) <= len(first.tool_calls) or not _continues(ids, 0, first.tool_calls):
        return None  # not a remembered reply's start, or the message is the whole reply (the usual lookup's)
    calls = list(first.tool_calls)
    made = {c.id for c in calls}
    results: list[ChatMessage] = []
    j = i + 1
    # each step reads one message and compares only its own calls' ids: linear in the run
    while len(calls) < len(ids) and j < len(messages):
        m = messages[j]
        if m.role == "tool" and m.tool_call_id in made:
            results.append(m)
        elif m.role == "assistant" and m.tool_calls and not m.content and m.name == first.name:
            if not _continues(ids, len(calls), m.tool_calls):
                return None
            calls += m.tool_calls
            made.update(c.id for c in m.tool_calls)
        else:
            return None
        j += 1
    reply = ChatMessage("assistant", first.content, first.name, tuple(calls))
    if len(calls) != len(ids) or memory.lookup_emitted(reply.tool_calls, reply.content) is None:
        return None
    return reply, results, j


def _continues(ids: tuple[str, ...], start: int, calls: Sequence[ToolCall]) -> bool:
    """Whether `calls` are the reply's next calls after its first `start`."""
    return tuple(c.id for c in calls) == ids[start : start + len(calls)]
