"""A body's tools and structured-output fields as the engine takes them, and its chat history rendered with them.

- `grammar_of(body)`: the `GrammarSpec` of `response_format` (json_object, json_schema with `strict`), `regex` or
  `grammar` (EBNF: GBNF or Lark), at most one of them; None for none or `{"type": "text"}`.
- `tool_use_of(body)`: the `ToolUse` of `tools`, `tool_choice` and `parallel_tool_calls` (None without tools), every
  tool's `parameters` checked as a schema whatever the choice, so a bad one is refused even under "auto".
- `render_chat(engine, messages, use, namespace)`: the prompt text, by the model's chat template with the tools and
  the engine's memory of the calls its model wrote in the caller's namespace (so a replayed call is the very tokens
  the cache holds).
- `bad_request(exc)`: a `ToolInputError` or `GrammarError` (ValueErrors that name a path, from here or from the
  engine when it compiles the grammar) as a 400 whose `param` is that path in this server's dotted form
  (`tools[1].function.name` -> `tools.1.function.name`, as pydantic's paths are written).
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable, Sequence
from typing import Any

from radixcache.runtime.grammar.errors import GrammarError
from radixcache.runtime.grammar.schema_check import check_schema
from radixcache.runtime.grammar.spec import GrammarSpec
from radixcache.runtime.loading.tokenizer import lone_surrogate
from radixcache.runtime.server import legacy
from radixcache.runtime.server.protocol import APIError
from radixcache.runtime.tools.errors import ToolInputError
from radixcache.runtime.tools.prompt import chat_prompt
from radixcache.runtime.tools.use import ToolUse

_INDEX = re.compile(r"\[(\d+)\]")
CONSTRAINTS = ("response_format", "regex", "grammar")


def param_path(path: str) -> str:
    """`messages[2].tool_calls[0].id` -> `messages.2.tool_calls.0.id`."""
    return _INDEX.sub(r".\1", path)


def bad_request(exc: ToolInputError | GrammarError) -> APIError:
    return APIError(400, str(exc), param=param_path(exc.path))


def grammar_of(body: Any) -> GrammarSpec | None:
    """The one output constraint a body asks for, or None; two of them are a 400 naming the second."""
    given = [name for name in CONSTRAINTS if getattr(body, name, None) is not None]
    if body.response_format is not None and body.response_format.get("type") == "text" and len(given) > 1:
        given.remove("response_format")  # text is no constraint: a regex beside it is fine
    if len(given) > 1:
        raise APIError(400, f"give at most one of {', '.join(given)}: each constrains the whole output", param=given[1])
    try:
        if body.regex is not None:
            return GrammarSpec.regex(body.regex, path="regex")
        if body.grammar is not None:
            return GrammarSpec.ebnf(body.grammar, path="grammar")
        if body.response_format is not None:
            return GrammarSpec.from_response_format(body.response_format)
    except GrammarError as exc:
        raise bad_request(exc) from None
    return None


def tool_use_of(body: Any) -> ToolUse | None:
    """The request's tools (None when it gives none and tool_choice is absent or "none"); the deprecated `functions`
    and `function_call` as tools (runtime.server.legacy), their errors named by the legacy fields."""
    old = legacy.is_legacy(body)
    legacy.check_not_mixed(body)
    tools, choice, parallel = (
        legacy.tool_fields(body) if old else (body.tools, body.tool_choice, body.parallel_tool_calls)
    )
    if not tools and choice not in (None, "none"):  # OpenAI refuses it too: nothing to choose from
        name = "function_call" if old else "tool_choice"
        raise APIError(400, f"{name} is only allowed when {'functions' if old else 'tools'} are given", param=name)
    try:
        use = ToolUse.of(tools, choice, parallel)
        for i, tool in enumerate(use.tools if use is not None else ()):
            # as JSON schemas; what a grammar enforces only where one is built (engine.tool_calls.request_grammar)
            check_schema(tool.parameters, f"tools[{i}].function.parameters", enforced=False)
    except (ToolInputError, GrammarError) as exc:
        error = bad_request(exc)
        if old:
            error.param = param_path(legacy.legacy_path(exc.path))
            error.message = error.message.replace(exc.path, legacy.legacy_path(exc.path), 1)
        raise error from None
    return use


def render_chat(
    engine: Any, messages: Sequence[dict[str, Any]], use: ToolUse | None, namespace: Hashable = None
) -> str:
    """The prompt of a chat request: the template renders the history (tool turns included) and the tools, with
    the calls the model wrote remembered in `namespace` (the caller's cache namespace) only."""
    memory = getattr(engine, "tool_memory", None)
    try:  # as the engine renders a chat (runtime.tools.prompt)
        text = chat_prompt(engine.tokenizer, messages, use, memory, namespace)
    except ToolInputError as exc:  # a message the runtime cannot render (ChatMessageError), tools it cannot: its path
        raise bad_request(exc) from None
    except Exception as exc:  # a template that rejects this conversation (say, roles out of order)
        raise APIError(400, f"the chat template refused these messages: {exc}", param="messages") from None
    if (bad := lone_surrogate(text)) is not None:
        raise _surrogate_error(messages, bad)
    return text


def _surrogate_error(messages: Sequence[dict[str, Any]], bad: str) -> APIError:
    """A prompt holding a lone surrogate: the messages' strings are checked before, so it came from a call's
    arguments whose JSON escapes one ("\\ud800"), written raw by a template that prints an argument's value (tojson
    keeps the escape). Named by that call's path, where the tokenizer would have named nothing."""
    param = "messages"
    for i, m in enumerate(messages):
        for j, call in enumerate(m.get("tool_calls") or ()):
            arguments = call.get("function", {}).get("arguments") if isinstance(call, dict) else None
            try:
                decoded = json.dumps(json.loads(arguments), ensure_ascii=False) if isinstance(arguments, str) else ""
            except (ValueError, RecursionError):
                continue
            if lone_surrogate(decoded) is not None and param == "messages":
                param = f"messages.{i}.tool_calls.{j}.function.arguments"
    message = f"{param}: the chat template wrote a lone surrogate {bad!r} (a JSON escape), which is not valid Unicode"
    return APIError(400, message, param=param)
