"""Agent histories into the messages and variables a chat template renders, so that turn N+1's prompt extends
turn N's prompt and output token for token.

- Templates that read `tools` get them as `tools=[...]` (OpenAI's function format; `tools=None` without tools, as
  transformers passes it: Mistral v0.3's `tools is not none` was true of an undefined `tools`, so a plain chat read
  an empty `[AVAILABLE_TOOLS] [][/AVAILABLE_TOOLS]` block), assistant tool calls as
  `tool_calls` with `arguments` as objects (Hugging Face's convention), and tool messages as `role: "tool"`.
- A template that reads `tools` but has no tool turn (it compares no role with "tool" or "ipython") gets tool
  results as the generic format's user messages below, and one that never reads `tool_calls` gets an assistant's
  calls as the text the model writes them in (the generic JSON, Hermes tags, Command-R's `Action:` block): given
  as fields it does not read, they vanished from the prompt, the model never seeing its calls nor their results.
- Other templates get the generic format: `generic_tools_prompt(tools)` appended to the first system message (or
  as a new first system message), assistant calls as the JSON text `{"tool_calls": [{"name": ..., "arguments":
  {...}}]}` the model was asked to write, and tool results as `role: "tool"` when the template has a tool turn,
  else as a user message starting "Tool result for NAME (ID):".
- An assistant turn whose calls the `ToolCallMemory` knows (the runtime generated them) is rendered as the exact
  text the model emitted, so its tokens are those the model generated and the radix cache holds; so is a reply
  sent back one message per call (runtime/tools/split_replies.py joins it). Not under Command R7B's template, which
  wraps a plain reply in `<|START_RESPONSE|>` and numbers the results by the calls: its calls render through the
  template, and where the memory knows the ids the model emitted, the tokenizer puts them in place of what the
  template printed for that reply (emitted_turns.py). Under Cohere's templates
  an assistant turn with calls carries its content as `tool_plan` too, where they read the text before the calls.
The developer role is the system message: it is rendered in the system message's place.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

from radixcache.runtime.tools.emitted_turns import EmittedTurn
from radixcache.runtime.tools.features import TemplateFeatures
from radixcache.runtime.tools.known_tokens import RememberedTurn
from radixcache.runtime.tools.memory import ToolCallMemory
from radixcache.runtime.tools.messages import ChatMessage, ToolCall, decoded_arguments
from radixcache.runtime.tools.specs import ToolSpec
from radixcache.runtime.tools.split_replies import joined_replies
from radixcache.runtime.tools.use import alphanumeric_id

TOOL_RESULT_PREFIX = "Tool result for"


def generic_tools_prompt(tools: Sequence[ToolSpec]) -> str:
    """The generic format's instructions: one JSON line per tool, then how to call them. It does not depend on
    tool_choice, so changing tool_choice between turns keeps the cached prefix (the grammar enforces the choice)."""
    lines = "\n".join(json.dumps(t.to_prompt(), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou can call these tools (functions). Each line is one tool as JSON: its name, what it does, and "
        f"its parameters as a JSON schema.\n{lines}\n\nTo call tools, reply with only this JSON object and nothing "
        'else:\n{"tool_calls": [{"name": "<tool name>", "arguments": {<the arguments as JSON>}}]}\nThe list may '
        "hold several calls. To answer without a tool, reply in plain text. Tool results come back in messages "
        f'that start with "{TOOL_RESULT_PREFIX}".'
    )


def generic_calls_text(calls: Sequence[ToolCall]) -> str:
    """Calls in the generic format, each call's arguments text kept exactly as given (compact separators elsewhere,
    the whitespace the grammar engine's JSON allows)."""
    items = ", ".join(
        f'{{"name": {json.dumps(c.name, ensure_ascii=False)}, "arguments": {c.arguments}}}' for c in calls
    )
    return f'{{"tool_calls": [{items}]}}'


def template_messages(
    messages: Sequence[ChatMessage],
    features: TemplateFeatures,
    *,
    tools: Sequence[ToolSpec] = (),
    memory: ToolCallMemory | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The message dicts and extra variables (`tools` for templates that read it) to render `messages` with."""
    native = features.uses_tools
    calls_text = CALLS_TEXT.get(features.format, generic_calls_text)
    fit = functools.partial(fitted_id, length=features.call_id_length)
    # R7B's template wraps a plain reply in <|START_RESPONSE|>...: a remembered call replayed as that text would read
    # as an answer, so its calls render through the template (its own syntax and numbering), the ids the model
    # emitted put in place of the template's text for the reply afterwards (EmittedTurn)
    whole = features.format == "command_r7b"
    recalled = None if whole else memory
    out: list[dict[str, Any]] = []
    for m in joined_replies(messages, memory):  # a reply sent back one message per call is that reply
        if m.role == "assistant" and m.tool_calls:
            # a template that reads `tools` but never `tool_calls` would drop the calls: they go as their text
            as_objects = native and not features.ignores_calls
            turn = _assistant_calls(m, as_objects, recalled, fit, plan=bool(features.command_r), text=calls_text)
            out.append(_emitted(turn, m, memory) if whole and as_objects else turn)
        elif m.role == "tool":  # a template with no tool turn drops one: the result goes as a user message
            out.append(_tool_result(m, features.tool_role, fit))
        else:
            d: dict[str, Any] = {"role": m.role, "content": m.content or ""}
            if m.name is not None:
                d["name"] = m.name
            out.append(d)
    variables: dict[str, Any] = {}
    if native:  # None without tools, as transformers passes it: undefined, `tools is not none` held (Mistral v0.3)
        shaped = cohere_tool if features.cohere_tools else ToolSpec.to_openai
        variables["tools"] = [shaped(t) for t in tools] if tools else None
    elif tools:
        block = generic_tools_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out, variables


# JSON schema types as the Python type names Cohere's tool definitions use
PYTHON_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list",
                "object": "dict", "null": "None"}  # fmt: skip


def cohere_tool(tool: ToolSpec) -> dict[str, Any]:
    """A tool in OpenAI's function format with Cohere's fields beside it (`name`, `description`,
    `parameter_definitions`: each top-level parameter's description, Python type name and whether it is required),
    for templates that read tools in Cohere's shape (Command-R and R+'s first tool_use templates); a template that
    reads OpenAI's fields finds them as before."""
    params = tool.parameters if isinstance(tool.parameters, dict) else {}
    properties = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = set(params.get("required") or ()) if isinstance(params.get("required"), list) else set()
    definitions = {}
    for name, prop in properties.items():
        prop = prop if isinstance(prop, dict) else {}
        kind = prop.get("type")
        if kind is None and isinstance(prop.get("enum"), list):  # an enum's type: its values' JSON types
            kind = list(dict.fromkeys(_json_type(v) for v in prop["enum"]))
        kinds = kind if isinstance(kind, list) else [kind]
        names = [PYTHON_TYPES.get(k, "Any") for k in kinds if isinstance(k, str)] or ["Any"]
        definitions[name] = {
            "description": prop.get("description", ""),
            "type": names[0] if len(names) == 1 else f"Union[{', '.join(names)}]",
            "required": name in required,
        }
    cohere = {"name": tool.name, "description": tool.description or "", "parameter_definitions": definitions}
    return {**tool.to_openai(), **cohere}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return {str: "string", float: "number", list: "array", dict: "object"}.get(type(value), "null")


def fitted_id(call_id: str, length: int | None) -> str:
    """A call id as the template gets it: itself, or where the template demands ids of `length` characters (Mistral's
    9: TemplateFeatures.call_id_length) and this one has another (a client made it up, `call_abc123xyz`, or another
    server did), that many letters and digits drawn from it: the same for the call and its result and at every turn,
    so the history renders and its prompt stays the same. The engine's own ids have that length already."""
    if length is None or len(call_id) == length:
        return call_id
    return alphanumeric_id(f"client id {call_id}", length)


def command_r_calls_text(calls: Sequence[ToolCall]) -> str:
    """Calls as Command-R and R+ write them: `Action:` and a fenced JSON list of `tool_name` and `parameters`, each
    call's arguments text kept as given."""
    items = ", ".join(
        f'{{"tool_name": {json.dumps(c.name, ensure_ascii=False)}, "parameters": {c.arguments}}}' for c in calls
    )
    return f"Action: ```json\n[{items}]\n```"


def hermes_calls_text(calls: Sequence[ToolCall]) -> str:
    """Calls as Hermes-style templates have the model write them: each in a `<tool_call>` tag, one per line."""
    return "\n".join(
        f'<tool_call>\n{{"name": {json.dumps(c.name, ensure_ascii=False)}, "arguments": {c.arguments}}}\n</tool_call>'
        for c in calls
    )


CALLS_TEXT = {"hermes": hermes_calls_text, "command_r": command_r_calls_text}


def _assistant_calls(
    m: ChatMessage,
    native: bool,
    memory: ToolCallMemory | None,
    fit: Callable[[str], str],
    plan: bool = False,
    text: Callable[[Sequence[ToolCall]], str] = generic_calls_text,
) -> dict[str, Any]:
    found = memory.lookup_emitted(m.tool_calls, m.content) if memory is not None else None
    if found is not None:
        turn = RememberedTurn(role="assistant", content=found[0])
        turn.token_ids = found[1]  # where the text lies in the prompt, these ids are spliced in (known_tokens)
        return turn
    if native:
        calls = [
            {
                "id": fit(c.id),
                "type": "function",
                "function": {"name": c.name, "arguments": decoded_arguments(c.arguments)},
            }
            for c in m.tool_calls
        ]
        turn = {"role": "assistant", "content": m.content or "", "tool_calls": calls}
        # `tool_plan`: Cohere's templates print an assistant's text before its calls from it (R7B's thinking)
        return {**turn, "tool_plan": m.content or ""} if plan else turn
    written = text(m.tool_calls)
    return {"role": "assistant", "content": f"{m.content}\n{written}" if m.content else written}


def _emitted(turn: dict[str, Any], m: ChatMessage, memory: ToolCallMemory | None) -> dict[str, Any]:
    """`turn` (rendered by the template) as an EmittedTurn where the memory knows the ids the model emitted for it."""
    found = memory.lookup_emitted(m.tool_calls, m.content) if memory is not None else None
    if found is None or not found[1]:
        return turn
    emitted = EmittedTurn(turn)
    emitted.token_ids = found[1]
    return emitted


def _tool_result(m: ChatMessage, tool_turn: bool, fit: Callable[[str], str]) -> dict[str, Any]:
    if tool_turn:
        d: dict[str, Any] = {"role": "tool", "content": m.content or "", "tool_call_id": fit(m.tool_call_id or "")}
        if m.name is not None:
            d["name"] = m.name
        return d
    return {"role": "user", "content": f"{TOOL_RESULT_PREFIX} {m.name or 'a tool'} ({m.tool_call_id}):\n{m.content}"}
