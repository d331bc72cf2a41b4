"""A chat's prompt: the one way the engine (runtime.engine.request_builder), the server (runtime.server.structured)
and the cluster's front door (runtime.cluster.calls) render a history with a request's tools and the memory of the
calls the model wrote, so the three give the same text for the same history (a copy each had drifted apart once:
the next turn then missed the cache on one path only)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Hashable, Sequence
from typing import Any

from radixcache.runtime.tools.errors import ToolInputError
from radixcache.runtime.tools.memory import ToolCallMemory
from radixcache.runtime.tools.use import ToolUse


def chat_prompt(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tool_use: ToolUse | None = None,
    memory: ToolCallMemory | None = None,
    namespace: Hashable = None,
) -> str:
    """`messages` by `tokenizer`'s chat template with the assistant turn's start: `tool_use`'s tools, and the calls
    `memory` holds in `namespace` (the request's cache namespace) rendered as the model wrote them. A tokenizer whose
    `apply_chat_template` takes no tools (a plain one, a test's) renders the messages alone, and refuses tools with
    a ToolInputError naming `tools`."""
    render = tokenizer.apply_chat_template
    kw: dict[str, Any] = {}
    if renders_tools(render):
        scoped = None if memory is None else memory.scoped(namespace)  # not `memory and`: an empty one is falsy
        kw = {"tools": tool_use.tools if tool_use is not None else None, "tool_memory": scoped}
    elif tool_use is not None:
        raise ToolInputError("tools", "this model's tokenizer cannot render tools")
    return render(list(messages), add_generation_prompt=True, **kw)


def renders_tools(render: Any) -> bool:
    """Whether a chat template function takes `tools` and `tool_memory` (radixcache's Tokenizer's does), read once
    per function."""
    return _takes_tool_memory(getattr(render, "__func__", render))  # a bound method is a new object each time


@functools.lru_cache(maxsize=64)
def _takes_tool_memory(fn: Any) -> bool:
    try:
        return "tool_memory" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): it takes no such keyword
        return False
