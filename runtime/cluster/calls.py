"""The front door's tool calls (runtime.cluster.front): a result's calls under the ids its stream sent, remembered with
what the replica's model wrote for them, and chats rendered with that memory, as an Engine renders them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from radixcache.runtime.cluster.handles import RemoteRequest
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.tools import ToolCallMemory
from radixcache.runtime.tools.prompt import chat_prompt
from radixcache.runtime.tools.tool_turns import check_tool_turns


def own_calls(
    memory: ToolCallMemory, result: Any, emitted: tuple[str, Sequence[int]] | None, req: RemoteRequest, namespace: Any
) -> Any:
    """`result` with its tool calls under `req`'s call ids (those its stream's parser gave them: both parse the same
    text and draw ids in call order), remembered in `memory` with what the model `emitted` for them (text, token
    ids), in the request's `namespace`, as an engine keeps them (a tenant's calls are its own)."""
    calls = getattr(result, "tool_calls", None)
    if not calls or req.call_ids is None:
        return result
    new_id = req.call_ids.sequence()
    calls = tuple(replace(c, id=new_id()) for c in calls)
    if emitted is not None:
        memory.scoped(namespace).remember(calls, emitted[0], emitted[1], content=result.text)
    return replace(result, tool_calls=calls)


def render_messages(
    tokenizer: Any, memory: ToolCallMemory, messages: Sequence[dict[str, Any]], opts: RequestOptions
) -> str:
    """`messages` by the model's chat template, with `opts`' tools and the calls `memory` holds in its namespace (the
    front door's: a history carries its call ids, which a replica's own memory knows by others), as an Engine and
    the server render a chat (runtime.tools.prompt); its tool turns checked as theirs (runtime.tools.tool_turns)."""
    check_tool_turns(messages)
    return chat_prompt(tokenizer, messages, opts.tool_use, memory, opts.namespace)
