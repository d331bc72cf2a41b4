"""A Responses request as the chat endpoint's body: its items as chat messages, its flat tools as chat tools,
`tool_choice` and `text.format` as chat's forms, so it runs through the chat path's own rendering, generation,
tool-call parsing and structured output (runtime.server.responses_route).

- Items (`input`, and the stored chain of `previous_response_id`): messages (role user, system, developer or
  assistant; content a string or `input_text` / `output_text` parts, an empty list of them a 400 naming
  `input.i.content` except on an assistant message, as chat's `content: []`; `"type": "message"` optional) become chat
  messages; a `function_call` joins the assistant message before it (or starts one) as a tool call whose id is
  its `call_id`; a `function_call_output` becomes a `tool` message answering its `call_id` (its `output: []` a 400
  as a tool message's `content: []`; on both, the SDK's
  `async`, `caller`, `namespace`, `created_by` and `name` fields are accepted where they leave the prompt as it is:
  `_check_call_context`).
  `instructions` is the system message, first. Any other item (reasoning, images, files, hosted tools' calls) is a
  400 naming it.
- `items_of` checks the items and returns them in one canonical form (what the response store keeps), each with an
  id (its own, or a new `msg_`, `fc_` or `fco_` one), as `GET /v1/responses/{id}/input_items` lists them (`listed`).
- `renamed(error, origins)`: a 400 the chat path raised, its `param` in the Responses names (`messages.3.content`
  -> `input.2.content`, `tools.0.function.parameters` -> `tools.0.parameters`, `response_format` -> `text.format`).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from radixcache.runtime.loading.tokenizer import lone_surrogate
from radixcache.runtime.server.protocol import MAX_LABEL_CHARS, APIError, ChatCompletionRequest
from radixcache.runtime.server.responses_output import new_id
from radixcache.runtime.server.responses_protocol import PASSED, ResponsesRequest
from radixcache.runtime.server.structured import param_path
from radixcache.runtime.server.validation_errors import validation_message

ROLES = ("user", "system", "developer", "assistant")
_KEYS = {
    "message": {"type", "role", "content", "id", "status", "phase"},
    "function_call": {
        "type",
        "id",
        "call_id",
        "name",
        "arguments",
        "status",
        "async",
        "caller",
        "namespace",
        "created_by",
    },
    "function_call_output": {"type", "id", "call_id", "output", "status", "caller", "namespace", "created_by", "name"},
}
_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}  # of the ids given to items
_PART_KEYS = {"type", "text", "annotations", "logprobs", "prompt_cache_breakpoint"}
_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}
PREVIOUS = "previous_response_id"  # the origin of an item from the stored chain


def _text(value: Any, path: str) -> str:
    """A content or output: a string, or text parts joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise APIError(400, f"{path}: must be a string or a list of text parts", param=path)
    out = []
    for j, part in enumerate(value):
        here = f"{path}.{j}"
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise APIError(400, f"{here}: only text parts (input_text, output_text), got {kind!r}", param=here)
        for key in part.keys() - _PART_KEYS:
            raise APIError(400, f"Unrecognized content part field: {here}.{key}", param=f"{here}.{key}")
        if (
            part.get("prompt_cache_breakpoint") is not None
        ):  # the SDK's dump writes null; this server caches every prefix
            here = f"{here}.prompt_cache_breakpoint"
            raise APIError(400, f"{here}: explicit cache breakpoints are not supported (only null)", param=here)
        if not isinstance(part.get("text"), str):
            raise APIError(400, f"{here}.text: must be a string", param=f"{here}.text")
        out.append(part["text"])
    return "".join(out)


def _valid_unicode(text: str, path: str) -> None:
    if (bad := lone_surrogate(text)) is not None:
        raise APIError(400, f"{path}: not valid Unicode: it holds a lone surrogate {bad!r}", param=path)


def unicode_checked(value: Any, path: str) -> Any:
    """`value` if its strings and keys are valid Unicode. JSON's escapes can spell a lone surrogate ("\\ud800"), which
    no UTF-8 answer can hold: kept in a stored item or echoed in the response, it would fail every answer that
    shows it (the response, `input_items`), and the chat path's checks see only what reaches the prompt. A bad key
    is named by its object's path (the key itself cannot be shown)."""
    stack = [(value, path)]
    while stack:
        item, here = stack.pop()
        if isinstance(item, str):
            _valid_unicode(item, here)
        elif isinstance(item, dict):
            for key in item:  # before the paths that hold it
                _valid_unicode(str(key), here)
            stack += [(child, f"{here}.{key}") for key, child in item.items()]
        elif isinstance(item, list):
            stack += [(child, f"{here}.{i}") for i, child in enumerate(item)]
    return value


def _string(item: dict[str, Any], key: str, path: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (key != "arguments" and not value):
        raise APIError(400, f"{path}.{key}: must be a non-empty string", param=f"{path}.{key}")
    if key == "call_id" and len(value) > MAX_LABEL_CHARS:  # the chat path's bound of a tool message's tool_call_id
        here = f"{path}.call_id"
        raise APIError(400, f"{here}: must be at most {MAX_LABEL_CHARS} characters", param=here)
    return value


def _check_call_context(item: dict[str, Any], path: str) -> None:
    """The fields openai's SDK (3.63) writes on a function_call or function_call_output (null unless set), none of
    which the prompt holds, so a replayed `item.model_dump(by_alias=True)` (of a response's output, or of listed input
    items) is accepted: `async` (whether the client runs the call in the background) any boolean; `created_by` (who
    made the item) and an output's `name` any string; `caller` `{"type": "direct"}` (the model made the call, as
    every call here), not a program's; `namespace` none (this server's tools are flat functions: a namespaced call
    names a tool it has not)."""
    if item.get("async") is not None and not isinstance(item["async"], bool):
        raise APIError(400, f"{path}.async: must be a boolean or null", param=f"{path}.async")
    for key in ("created_by", "name") if item.get("type") == "function_call_output" else ("created_by",):
        if item.get(key) is not None and not isinstance(item[key], str):
            raise APIError(400, f"{path}.{key}: must be a string or null", param=f"{path}.{key}")
    caller = item.get("caller")
    if caller is not None and caller != {"type": "direct"}:
        here = f"{path}.caller"
        raise APIError(400, f'{here}: only calls the model made ({{"type": "direct"}}) are supported', param=here)
    if item.get("namespace") is not None:
        here = f"{path}.namespace"
        raise APIError(400, f"{here}: namespaced tools are not supported by this server (only null)", param=here)


def item_of(item: Any, path: str) -> dict[str, Any]:
    """One input item, checked, in the canonical form."""
    if not isinstance(unicode_checked(item, path), dict):
        raise APIError(400, f"{path}: an item must be an object", param=path)
    kind = item.get("type", "message" if "role" in item else None)
    if not isinstance(kind, str) or kind not in _KEYS:
        raise APIError(
            400,
            f"{path}.type: {kind!r} items are not supported by this server (messages, function_call and "
            "function_call_output are)",
            param=f"{path}.type",
        )
    for key in sorted(item.keys() - _KEYS[kind])[:1]:  # the first unknown key
        raise APIError(400, f"Unrecognized input item field: {path}.{key}", param=f"{path}.{key}")
    if item.get("id") is not None and (not isinstance(item["id"], str) or not 0 < len(item["id"]) <= MAX_LABEL_CHARS):
        raise APIError(400, f"{path}.id: must be a string of 1 to {MAX_LABEL_CHARS} characters", param=f"{path}.id")
    out: dict[str, Any] = {"id": item.get("id") or new_id(_PREFIX[kind]), "type": kind}
    if kind == "message":
        if item.get("role") not in ROLES:
            raise APIError(400, f"{path}.role: must be one of {', '.join(ROLES)}", param=f"{path}.role")
        if item.get("content") == [] and item["role"] != "assistant":  # as the chat path's messages.i.content
            here = f"{path}.content"
            raise APIError(400, f"{here}: must not be an empty list of parts on a {item['role']} message", param=here)
        return {**out, "role": item["role"], "content": _text(item.get("content"), f"{path}.content")}
    if kind == "function_call":
        _check_call_context(item, path)
        return {**out, **{k: _string(item, k, path) for k in ("call_id", "name", "arguments")}}
    _check_call_context(item, path)
    if item.get("output") == []:  # a tool message's `content: []`, which the chat path refuses
        raise APIError(400, f"{path}.output: must not be an empty list of parts", param=f"{path}.output")
    return {**out, "call_id": _string(item, "call_id", path), "output": _text(item.get("output"), f"{path}.output")}


def listed(item: dict[str, Any]) -> dict[str, Any]:
    """A canonical item as `GET /v1/responses/{id}/input_items` lists it (OpenAI's item shapes)."""
    out = {**item, "status": "completed"}
    if item["type"] == "message":
        kind = "output_text" if item["role"] == "assistant" else "input_text"
        part = {"type": kind, "text": item["content"], **({"annotations": []} if kind == "output_text" else {})}
        out["content"] = [part]
    return out


def items_of(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's own items, checked; a string input is one user message."""
    if isinstance(body.input, str):
        return [item_of({"role": "user", "content": body.input}, "input")]
    return [item_of(item, f"input.{i}") for i, item in enumerate(body.input)]


def replayed(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stored response's output items as the history of a follow-up, every one: a call cut short (max_output_tokens,
    a stop string, the timeout) too, as a client replaying the output itself sends it and runtime.engine.session
    keeps it, so the follow-up's prompt holds what the model wrote (its arguments are rendered as written) and
    extends the cached prompt."""
    return [item_of(item, PREVIOUS) for item in output]


def unique_ids(items: list[dict[str, Any]], origins: list[str]) -> None:
    """A 400 naming the first item whose id an earlier item of the conversation has (as OpenAI's "Duplicate item
    found"): `input_items` pages by id (`after`), and a repeated id would send a client back to its first copy
    forever. Most often a follow-up that sends its previous response's output again beside previous_response_id."""
    seen: set[str] = set()
    for item, origin in zip(items, origins, strict=True):
        if item["id"] in seen:
            raise APIError(
                400,
                f"{origin}.id: duplicate item id {item['id']!r}: each item of a conversation is sent once (a follow-up "
                "by previous_response_id sends only its new items)",
                param=f"{origin}.id",
            )
        seen.add(item["id"])


def messages_of(
    items: list[dict[str, Any]], origins: list[str], instructions: str | None
) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """Chat messages from canonical items, and for each message the paths of the items it came from (its calls'
    items after its own). An assistant message right after calls is their turn's text, as one before them is, the
    two joined when both are there."""
    messages: list[dict[str, Any]] = []
    sources: list[list[str]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
        sources.append(["instructions"])
    for item, origin in zip(items, origins, strict=True):
        kind = item["type"]
        last = messages[-1] if messages else {}
        if kind == "message" and item["role"] == "assistant" and last.get("tool_calls"):
            # text the model wrote after its calls: a stream lists it after them (and what it wrote before them in an
            # item of its own), the whole answer all of it, joined, before them; one turn either way (a second
            # assistant message was another prompt, and the cache missed from there)
            if last["content"] is None:
                sources[-1][0] = origin
            last["content"] = ((last["content"] or "") + item["content"]) or None
        elif kind == "message":
            messages.append({"role": item["role"], "content": item["content"]})
            sources.append([origin])
        elif kind == "function_call":
            function = {"name": item["name"], "arguments": item["arguments"]}
            call = {"id": item["call_id"], "type": "function", "function": function}
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": None})
                sources.append([origin])
            last = messages[-1]
            last["content"] = last["content"] or None  # a reply that is only calls: content null, as chat's
            last.setdefault("tool_calls", []).append(call)
            sources[-1].append(origin)
        else:
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
            sources.append([origin])
    return messages, sources


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses' flat function tools in chat's form; another tool type is a 400 naming it."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(unicode_checked(tool, f"tools.{i}"), dict):  # echoed in the response, rendered in the prompt
            raise APIError(400, f"tools.{i}: a tool must be an object", param=f"tools.{i}")
        if tool.get("type") != "function":
            raise APIError(
                400,
                f"tools.{i}.type: only function tools are supported by this server, got {tool.get('type')!r}",
                param=f"tools.{i}.type",
            )
        for key in sorted(tool.keys() - _TOOL_KEYS)[:1]:  # the first unknown key
            hint = " (Responses tools are flat: name and parameters beside type)" if key == "function" else ""
            raise APIError(400, f"Unrecognized tool field: tools.{i}.{key}{hint}", param=f"tools.{i}.{key}")
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function":
        raise APIError(
            400,
            f"tool_choice.type: only function choices are supported by this server, got {choice.get('type')!r}",
            param="tool_choice.type",
        )
    for key in sorted(choice.keys() - {"type", "name"})[:1]:  # the first unknown key
        raise APIError(400, f"Unrecognized tool_choice field: tool_choice.{key}", param=f"tool_choice.{key}")
    if not isinstance(choice.get("name"), str):  # the chat path's 400 would show its own shape, `function.name`
        raise APIError(
            400,
            f'tool_choice.name: a named choice is {{"type": "function", "name": ...}}, got {choice.get("name")!r}',
            param="tool_choice.name",
        )
    return {"type": "function", "function": {"name": choice["name"]}}


def response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type != "json_schema":  # a `schema` beside json_object would constrain nothing,
        given = [n for n in type(fmt).model_fields if n != "type" and getattr(fmt, n) is not None]
        if given:  # while its caller believes it does: refused, as chat's response_format refuses it
            key = "schema" if given[0] == "json_schema" else given[0]
            message = f"text.format.{key}: unknown field {key!r} (a {fmt.type} format takes only type)"
            raise APIError(400, message, param=f"text.format.{key}")
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.json_schema is None:
        raise APIError(400, "text.format.schema: a json_schema format needs its schema", param="text.format.schema")
    schema = unicode_checked(fmt.json_schema, "text.format.schema")  # echoed in the response
    spec: dict[str, Any] = {"name": fmt.name or "response", "schema": schema}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    if fmt.description is not None:
        spec["description"] = fmt.description
    return {"type": "json_schema", "json_schema": spec}


def chat_body(
    body: ResponsesRequest, messages: list[dict[str, Any]], sources: list[list[str]]
) -> ChatCompletionRequest:
    """The chat body this request is; its errors are named by the Responses fields."""
    out: dict[str, Any] = {"model": body.model, "messages": messages}
    out.update({name: getattr(body, name) for name in PASSED if getattr(body, name) is not None})
    tools = chat_tools(body.tools)
    if tools:
        out["tools"] = tools
    else:  # no tools: nothing to choose among, nothing to call in parallel (OpenAI accepts these then)
        out.pop("parallel_tool_calls", None)
    if body.tool_choice is not None and (tools or body.tool_choice not in ("auto", "none")):
        out["tool_choice"] = chat_tool_choice(body.tool_choice)
    if body.max_output_tokens is not None:
        out["max_completion_tokens"] = body.max_output_tokens
    fmt = response_format(body)
    if fmt is not None:
        out["response_format"] = fmt
    try:
        return ChatCompletionRequest.model_validate(out)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors()))
        raise renamed(APIError(400, message, param=param), sources) from None


_RENAMES = (
    ("response_format.json_schema.", "text.format."),
    ("response_format", "text.format"),
    ("tool_choice.function.", "tool_choice."),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
)


def renamed(error: APIError, sources: list[list[str]]) -> APIError:
    """`error` with its `param` (a chat field's path) as the Responses field's path."""
    param = error.param
    if param is None:
        return error
    parts = param.split(".")
    if parts[0] == "messages" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < len(sources):
        origin = sources[int(parts[1])]
        rest = parts[2:]
        if rest[:1] == ["tool_calls"] and len(rest) > 1 and rest[1].isdigit() and int(rest[1]) + 1 < len(origin):
            tail = [p for p in rest[2:] if p != "function"]
            param = ".".join([origin[int(rest[1]) + 1], *(["call_id"] if tail == ["id"] else tail)])
        else:
            param = ".".join([origin[0], *rest])
    elif parts[0] == "messages":
        param = "input"
    elif parts[0] == "tools" and len(parts) > 2 and parts[2] == "function":
        param = ".".join(parts[:2] + parts[3:])
    else:
        for old, new in _RENAMES:
            if param.startswith(old):
                param = new + param[len(old) :]
                break
    if param != error.param:
        head, sep, rest = error.message.partition(": ")
        if sep and param_path(head) == error.param:  # the chat path's own form, `messages[1].tool_calls[0]...: `
            error.message = f"{param}: {rest}"
        else:
            error.message = error.message.replace(error.param, param, 1)
        error.param = param
    return error
