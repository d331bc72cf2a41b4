"""The JSON schema of what the model may answer under a tool_choice, in the generic format, for the grammar engine.

- "required": `{"tool_calls": [call, ...]}` with at least one call, each `{"name": <a tool's name>, "arguments":
  <that tool's parameters schema>}` (keys in that order, no others); one call at most when `parallel_tool_calls` is
  false.
- a named function: the same with that function only.
- "auto": None. "Text or a call" is not a JSON schema (text is not JSON); `auto_tool_grammar` gives it as a Lark
  grammar instead (llguidance's `%json`), for a caller that wants auto constrained: either the calls object of
  "required", or text that does not start with `{` or whitespace. "none": None, and the output is not parsed for
  calls.
The schema is for the generic format and for templates that render tools themselves but write no call tags
("native": the parser reads the same JSON). Templates whose calls are `<tool_call>` tags ("hermes") get None here:
`hermes_tool_grammar` gives their calls as a Lark grammar, each tag around the JSON of one call; so do Cohere's
("command_r", "command_r7b"): `command_r_tool_grammar` gives their block around a JSON list of calls.
`format_tool_grammar` picks the one of a format.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from radixcache.runtime.tools.features import TemplateFeatures
from radixcache.runtime.tools.specs import ToolChoice, ToolSpec

NAME_KEYS = ("name", "arguments")  # a call's keys in the generic format (and Hermes tags, Mistral's lists)
COMMAND_R_KEYS = ("tool_name", "parameters")  # Cohere's
# R7B's index of a call, before its name: bounded, so a model cannot write digits without end
CALL_INDEX = {"tool_call_id": {"type": "string", "pattern": "^[0-9]{1,3}$"}}


def call_schema(
    tool: ToolSpec,
    defs: dict[str, Any] | None = None,
    keys: tuple[str, str] = NAME_KEYS,
    before: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One call of `tool`: its name as a constant, its parameters as the arguments (under `keys`; `before`: other
    required properties written first). The parameters' local `$ref`s are root-relative, so once nested here they
    would point nowhere: their `$defs` / `definitions` go into `defs` (the root's `$defs`, under names prefixed by the
    tool's) and the refs are rewritten to them (`hoisted`)."""
    arguments = tool.parameters if defs is None else hoisted(tool, defs)
    properties = {**(before or {}), keys[0]: {"const": tool.name}, keys[1]: arguments}
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


LITERALS = ("enum", "const", "default", "examples")  # keywords whose values are data, not schemas
NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # names to schemas


def _named(value: Any, walk: Callable[[Any], Any]) -> Any:
    """A map of names to schemas (`properties`, ...) walked schema by schema: its keys are names, not keywords (a
    property may be called `default` or `enum` and hold a `$ref`)."""
    return {name: walk(sub) for name, sub in value.items()} if isinstance(value, dict) else walk(value)


def hoisted(tool: ToolSpec, defs: dict[str, Any]) -> Any:
    """`tool.parameters` without its `$defs` / `definitions`, which are added to `defs` as `<tool>.<name>`; every
    local `$ref` rewritten to point there (`#/$defs/X` and `#/definitions/X` to `#/$defs/<tool>.X`; any other
    pointer into the parameters, `#` itself included, to a copy of them kept as `<tool>`). A tool's name has no
    ".", so no two tools' names meet (with `__`, tool "a"'s "b__c" and tool "a__b"'s "c" were one, the later kept)."""
    params = tool.parameters
    if not isinstance(params, dict):
        return params
    prefix = f"{tool.name}."
    local = {k: v for key in ("$defs", "definitions") for k, v in (params.get(key) or {}).items()}
    body = {k: v for k, v in params.items() if k not in ("$defs", "definitions")}
    uses_root = False

    def ref(pointer: str) -> str:
        nonlocal uses_root
        for key in ("/$defs/", "/definitions/"):
            if pointer.startswith("#" + key):
                return "#/$defs/" + prefix + pointer[len(key) + 1 :]
        uses_root = True
        return "#/$defs/" + tool.name + pointer[1:]

    def rewrite(node: Any) -> Any:
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: _named(v, rewrite) if k in NAMED else v if k in LITERALS else rewrite(v) for k, v in node.items()}
        if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
            out["$ref"] = ref(node["$ref"])
        return out

    if not local and "$ref" not in json.dumps(body):
        return params
    defs.update({prefix + name: rewrite(sub) for name, sub in local.items()})
    arguments = rewrite(body)
    if uses_root:
        defs[tool.name] = arguments
    return arguments


def tool_call_schema(
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    *,
    parallel_tool_calls: bool = True,
    features: TemplateFeatures | None = None,
) -> dict[str, Any] | None:
    """The schema the output must follow, or None when it is not constrained (see the module docstring)."""
    if features is not None and features.format not in ("generic", "native"):
        return None
    items = one_call_schema(tools, choice)
    if items is None:
        return None
    defs = items.pop("$defs", None)  # root-relative refs: their definitions go to this schema's root
    array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not parallel_tool_calls:
        array["maxItems"] = 1
    schema = {
        "type": "object",
        "properties": {"tool_calls": array},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    return {**schema, "$defs": defs} if defs else schema


def one_call_schema(
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    keys: tuple[str, str] = NAME_KEYS,
    before: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The schema of one call the choice allows ("required": any tool; a named function: that one), else None
    (`keys`, `before`: as `call_schema` takes them)."""
    if choice.mode == "required":
        allowed = list(tools)
    elif choice.mode == "function":
        allowed = [t for t in tools if t.name == choice.name]
    else:
        return None
    if not allowed:
        return None
    defs: dict[str, Any] = {}
    calls = [call_schema(t, defs, keys, before) for t in allowed]
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {**one, "$defs": defs} if defs else one  # the tools' definitions, at the root of the call's schema


def hermes_tool_grammar(
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    *,
    parallel_tool_calls: bool = True,
    close: Callable[[dict[str, Any]], dict[str, Any]] = lambda schema: schema,
    special: frozenset[str] = frozenset(),
) -> str | None:
    """The calls a "required" or named tool_choice allows in the Hermes format, as a Lark grammar (llguidance's
    `%json`): one `<tool_call>` tag (more, one per line, when `parallel_tool_calls`), each holding the JSON of one
    call (`close` applied to its schema); a tag in `special` (the tokenizer has it as a special token) may be that
    token or its text. None for "auto" and "none"."""
    one = one_call_schema(tools, choice)
    if one is None:
        return None
    start = 'start: tagged ("\\n" tagged)*' if parallel_tool_calls else "start: tagged"
    tags = '"<tool_call>\\n" call "\\n</tool_call>"'
    if special & {"<tool_call>", "</tool_call>"}:
        tags = f'{_marker("<tool_call>", special)} "\\n" call "\\n" {_marker("</tool_call>", special)}'
    return f"{start}\ntagged: {tags}\ncall: {json_rule(close(one))}\n"


def command_r_tool_grammar(
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    fmt: str,
    *,
    parallel_tool_calls: bool = True,
    close: Callable[[dict[str, Any]], dict[str, Any]] = lambda schema: schema,
    special: frozenset[str] = frozenset(),
) -> str | None:
    """The calls a "required" or named tool_choice allows in Cohere's formats, as a Lark grammar: Command-R / R+'s
    ``Action: ```json\n[...]\n``` `` ("command_r") or R7B's `<|START_ACTION|>[...]<|END_ACTION|>` ("command_r7b", each
    call led by its `tool_call_id`), the list holding one call's JSON (more when `parallel_tool_calls`), each
    `{"tool_name": <const>, "parameters": <the tool's parameters>}` (`close` applied). R7B's markers in `special`
    (those the tokenizer has as special tokens: runtime.tools.call_tokens.special_markers) may be written as those
    tokens or as text. None for "auto" and "none"."""
    r7b = fmt == "command_r7b"
    one = one_call_schema(tools, choice, COMMAND_R_KEYS, CALL_INDEX if r7b else None)
    if one is None:
        return None
    defs = one.pop("$defs", None)
    array: dict[str, Any] = {"type": "array", "items": one, "minItems": 1}
    if not parallel_tool_calls:
        array["maxItems"] = 1
    action = json_rule(close({**array, "$defs": defs} if defs else array))
    opening, closing = (
        (_marker("<|START_ACTION|>", special), _marker("<|END_ACTION|>", special))
        if r7b
        else (
            '"Action: ```json\\n"',
            '"\\n```"',
        )
    )
    return f"start: {opening} action {closing}\naction: {action}\n"


def _marker(text: str, special: frozenset[str]) -> str:
    """A marker as a Lark item: its text, or where the tokenizer has it as a special token, that token or the text."""
    return f'({text} | "{text}")' if text in special else f'"{text}"'


def format_tool_grammar(
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    fmt: str,
    *,
    parallel_tool_calls: bool = True,
    close: Callable[[dict[str, Any]], dict[str, Any]] = lambda schema: schema,
    special: frozenset[str] = frozenset(),
) -> str | None:
    """The Lark grammar of the calls a choice allows in a format whose calls are no JSON document of their own
    ("hermes", "command_r", "command_r7b"); None for other formats, and for "auto" and "none"."""
    if fmt == "hermes":
        return hermes_tool_grammar(tools, choice, parallel_tool_calls=parallel_tool_calls, close=close, special=special)
    if fmt in ("command_r", "command_r7b"):
        return command_r_tool_grammar(
            tools, choice, fmt, parallel_tool_calls=parallel_tool_calls, close=close, special=special
        )
    return None


def auto_answer_grammar(
    tools: Sequence[ToolSpec],
    answer: dict[str, Any] | str,
    *,
    parallel_tool_calls: bool = True,
    features: TemplateFeatures | None = None,
    close: Callable[[dict[str, Any]], dict[str, Any]] = lambda schema: schema,
    special: frozenset[str] = frozenset(),
) -> str | None:
    """tool_choice "auto" with a constrained answer as a Lark grammar: the calls "required" allows (the calls
    object, or Hermes tags), or an answer: JSON that follows `answer` when it is a schema (`close` applied to the
    call schemas only: the answer comes as the caller made it), else `answer` is a Lark rule body already (a regex or
    EBNF grammar nested: runtime.grammar.nested). `special`: the format's markers the tokenizer has as special
    tokens (`format_tool_grammar`). None without tools."""
    required = ToolChoice("required")
    rule = answer if isinstance(answer, str) else json_rule(answer)
    fmt = "generic" if features is None else features.format
    if fmt not in ("generic", "native"):
        own = format_tool_grammar(
            tools, required, fmt, parallel_tool_calls=parallel_tool_calls, close=close, special=special
        )
        if own is None:
            return None
        # its start becomes the rule `calls` (its other rules: `tagged`, `call`, `action`, none named like these)
        own = own.replace("start:", "calls:", 1)
        return "start: answer | calls\n" + own + f"answer: {rule}\n"
    schema = tool_call_schema(tools, required, parallel_tool_calls=parallel_tool_calls, features=features)
    if schema is None:
        return None
    return f"start: calls | answer\ncalls: {json_rule(close(schema))}\nanswer: {rule}\n"


def json_rule(schema: dict[str, Any]) -> str:
    """llguidance's `%json` for `schema`, with the compact separators every other JSON grammar here uses (`, ` and
    `: `, no other whitespace: a small model left free loops on newlines), unless the schema sets its own. Options
    the schema sets (`lenient`, say) are added to these, not put in their place."""
    options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    own = schema.get("x-guidance")
    if isinstance(own, dict):
        options = {**options, **own}
    return "%json " + json.dumps({**schema, "x-guidance": options}, ensure_ascii=False)


def auto_tool_grammar(
    tools: Sequence[ToolSpec], *, parallel_tool_calls: bool = True, features: TemplateFeatures | None = None
) -> str | None:
    """tool_choice "auto" as a Lark grammar (for `GrammarSpec.ebnf`): the calls of "required", or plain text whose
    first character is neither `{` nor whitespace (so the parser never mistakes it for a call). None without tools
    or for templates with their own call syntax."""
    schema = tool_call_schema(tools, ToolChoice("required"), parallel_tool_calls=parallel_tool_calls, features=features)
    if schema is None:
        return None
    return f"start: calls | TEXT\ncalls: {json_rule(schema)}\nTEXT: /[^{{ \\t\\r\\n][\\s\\S]*/\n"
