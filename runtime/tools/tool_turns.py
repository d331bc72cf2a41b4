"""A chat history's tool turns checked against its calls, as OpenAI's chat completions check them: a tool message
answers a call an assistant message before it made, once; and every call an assistant message made is answered. Else
the model would read a result for no call, two results for one, or go on as if a call had run (the Responses path
refuses the like: runtime.server.responses_route). Every entry point that renders a chat checks it here: the server's
chat completions (runtime.server.tool_turns, a 400 naming the field), and Engine.chat / achat / fork / stream / pin
and the cluster's front door (runtime.engine.request_builder, runtime.cluster.calls), a ToolTurnError.

A history is read as runs: an assistant message with `tool_calls` opens one; further assistant messages with calls
and tool messages continue it (a client that sends a reply's parallel calls back one message per call, their results
after them or between them, still answers each: runtime/tools/split_replies.py renders such runs); any other message
(user, system, an assistant reply without calls) or the history's end closes it. Refused with a `ToolTurnError` (a
ToolInputError naming `messages[i].field`; its `param` the field as OpenAI names it, `messages.i.field`):

- a tool message whose `tool_call_id` is no call of its run (OpenAI's "messages with role 'tool' must be a response
  to a preceeding message with 'tool_calls'"; a result after a user message answers a call of no run), or one that
  answers a call already answered (OpenAI's "Duplicate value for 'tool_call_id'");
- a run that closes with a call unanswered (OpenAI's "An assistant message with 'tool_calls' must be followed by tool
  messages responding to each 'tool_call_id'"), the last message's calls too. A call cut short (its arguments no
  whole JSON object: the length limit stopped the model inside them, or "" after its name) was not made and needs no
  result, as in the Responses API; one may still be given.

Legacy turns (`function_call`, `role: "function"`) are checked after runtime.server.legacy made them tool turns,
and named by their legacy fields (`messages.i.function_call`, `messages.i.name`). A message malformed in its shape
is left to the renderer, which names it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixcache.runtime.tools.errors import ToolInputError
from radixcache.runtime.tools.parse import json_object


class ToolTurnError(ToolInputError):
    """A tool turn that answers no call, answers one twice, or a call left unanswered: `path` the field in Python's
    form (`messages[3].tool_call_id`), `param` in OpenAI's (`messages.3.tool_call_id`), `problem` OpenAI's message."""

    @property
    def param(self) -> str:
        return re.sub(r"\[(\d+)\]", r".\1", self.path)


@dataclass
class _Call:
    """One call of a run: its id, where it is (`param`, in Python's form), whether it was made, whether a result
    answered it (where)."""

    id: str
    param: str
    made: bool
    legacy: bool
    order: tuple[int, int]  # (message, call)
    answered_by: int | None = None


def check_tool_turns(messages: Sequence[Mapping[str, Any]], sent: Sequence[Mapping[str, Any]] | None = None) -> None:
    """A ToolTurnError for the first tool turn that answers no call of its run, or answers one twice, or for the first
    call a run leaves unanswered (see the module docstring). `sent`: the messages as the request sent them, before
    legacy turns became tool turns (the same length), by whose fields the errors are named."""
    sent = messages if sent is None else sent
    run: dict[str, list[_Call]] = {}  # the run's calls by id (a client may give two calls one id)
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(sent[i], Mapping):
            continue  # not a message: the renderer names it
        role, legacy = m.get("role"), sent[i].get("role") == "function" or "function_call" in sent[i]
        calls = m.get("tool_calls") if role == "assistant" else None
        if role == "tool":
            _answer(run, m.get("tool_call_id"), i, legacy)
        elif calls and isinstance(calls, list):
            if legacy:  # its arguments as sent: the legacy turn's "" (a call cut after its name) became "{}"
                calls = [{**calls[0], "function": sent[i]["function_call"]}]
            for j, c in enumerate(calls):
                if isinstance(c, dict):
                    run.setdefault(str(c.get("id")), []).append(_call(c, i, j, legacy))
        else:
            _close(run)
            run = {}
    _close(run)


def _call(call: Mapping[str, Any], i: int, j: int, legacy: bool) -> _Call:
    function = call.get("function")
    arguments = function.get("arguments") if isinstance(function, dict) else None
    made = isinstance(arguments, dict) or (isinstance(arguments, str) and json_object(arguments))
    param = f"messages[{i}].function_call" if legacy else f"messages[{i}].tool_calls[{j}].id"
    return _Call(str(call.get("id")), param, made, legacy, (i, j))


def _answer(run: dict[str, list[_Call]], call_id: Any, i: int, legacy: bool) -> None:
    if not isinstance(call_id, str):
        return  # no id: the renderer names messages.i.tool_call_id
    mine = run.get(call_id, [])
    open_call = next((c for c in mine if c.answered_by is None), None)
    if open_call is not None:
        open_call.answered_by = i
        return
    param = f"messages[{i}].name" if legacy else f"messages[{i}].tool_call_id"
    if mine:
        first = mine[0].answered_by
        repeated = (
            f"messages[{i}] answers the function_call that messages[{first}] answered"
            if legacy
            else f"Duplicate value for 'tool_call_id' of '{call_id}', in messages[{first}] and messages[{i}]"
        )
        raise ToolTurnError(param, f"Invalid parameter: {repeated}: each call is answered by one message")
    role, calls = ("function", "function_call") if legacy else ("tool", "tool_calls")
    what = "follows no function_call" if legacy else f"answers call '{call_id}', which no assistant message made"
    raise ToolTurnError(
        param,
        f"Invalid parameter: messages with role '{role}' must be a response to a preceeding message with '{calls}'. "
        f"messages[{i}] {what} since the last user, system or plain assistant message",
    )


def _close(run: dict[str, list[_Call]]) -> None:
    calls = sorted((c for same in run.values() for c in same), key=lambda c: c.order)
    missing = [c for c in calls if c.made and c.answered_by is None]
    if missing and missing[0].legacy:
        raise ToolTurnError(
            missing[0].param,
            f"An assistant message with 'function_call' must be followed by a message with role 'function' answering "
            f"it: {missing[0].param} has none",
        )
    if missing:
        ids = ", ".join(c.id for c in missing)
        raise ToolTurnError(
            missing[0].param,
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {ids}",
        )
