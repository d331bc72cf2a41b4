"""The chat completions path's check of a history's tool turns (runtime.tools.tool_turns, which the Engine and the
cluster's front door use too), its refusal a 400 as OpenAI's: its message OpenAI's, its `param` the field
(`messages.3.tool_call_id`, `messages.1.tool_calls.0.id`; legacy turns `messages.i.function_call` and
`messages.i.name`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radixcache.runtime.server.protocol import APIError
from radixcache.runtime.tools.tool_turns import ToolTurnError
from radixcache.runtime.tools.tool_turns import check_tool_turns as _check


def check_tool_turns(messages: Sequence[Mapping[str, Any]], sent: Sequence[Mapping[str, Any]] | None = None) -> None:
    """runtime.tools.tool_turns.check_tool_turns, its ToolTurnError a 400 naming the field as OpenAI does."""
    try:
        _check(messages, sent)
    except ToolTurnError as exc:
        raise APIError(400, exc.problem, param=exc.param) from None
