"""Tool definitions and tool_choice, validated once: OpenAI's function format in, frozen `ToolSpec`s out.

A tool is `{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}`; the name is
1 to 64 of `[A-Za-z0-9_-]` and unique; `parameters` is a JSON schema object (absent means no arguments; no NaN nor
Infinity, which JSON has not); a null field is absent, and any other field is refused by name (a misspelt
`parameter` left the tool without arguments, silently). tool_choice is "none", "auto", "required" or
`{"type": "function", "function": {"name": ...}}` naming a given tool, any other field of it refused by name too (a
misspelt `functon` beside the choice was dropped, silently).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixcache.runtime.tools.errors import ToolInputError
from radixcache.runtime.tools.json_values import non_finite_path

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call. `parameters` is kept as given (a JSON schema object)."""

    name: str
    description: str
    parameters_json: str  # the schema as canonical JSON text, so the spec stays hashable and immutable
    strict: bool = False

    @property
    def parameters(self) -> dict[str, Any]:
        return json.loads(self.parameters_json)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI function format, as Hugging Face templates receive it in `tools`."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}

    def to_prompt(self) -> dict[str, Any]:
        """What the generic format shows the model: name, description, parameters."""
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out["parameters"] = self.parameters
        return out


@dataclass(frozen=True)
class ToolChoice:
    """mode: "none", "auto", "required" or "function" (then `name` is the function's)."""

    mode: str = "auto"
    name: str | None = None


def _as_dict(value: Any) -> Any:
    """A pydantic model or a dict as a dict without its null fields (a null counts as absent, as in JSON bodies:
    `"description": None` from an undocumented function's `__doc__`); anything else as it is."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


def normalize_tools(tools: Sequence[Any] | None, path: str = "tools") -> tuple[ToolSpec, ...]:
    """Validated tools in the given order; `ToolInputError` names the first bad field."""
    if tools is None:
        return ()
    if not isinstance(tools, (list, tuple)):
        raise ToolInputError(path, "must be a list of tools")
    out: list[ToolSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(tools):
        tool, here = _as_dict(raw), f"{path}[{i}]"
        if not isinstance(tool, dict):
            raise ToolInputError(here, "must be an object")
        if tool.get("type", "function") != "function":
            raise ToolInputError(f"{here}.type", f"only 'function' tools are supported, got {tool.get('type')!r}")
        fn = _as_dict(tool.get("function"))
        if not isinstance(fn, dict):
            raise ToolInputError(f"{here}.function", "must be an object with a 'name'")
        _refuse_unknown(tool, ("type", "function"), here, "a tool")
        _refuse_unknown(fn, ("name", "description", "parameters", "strict"), f"{here}.function", "a function")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ToolInputError(f"{here}.function.name", f"must be 1 to 64 of A-Z a-z 0-9 _ -, got {name!r}")
        if name in seen:
            raise ToolInputError(f"{here}.function.name", f"{name!r} is defined twice")
        seen.add(name)
        description = fn.get("description", "")
        if not isinstance(description, str):
            raise ToolInputError(f"{here}.function.description", "must be a string")
        parameters = fn.get("parameters", NO_PARAMETERS)
        if parameters is None:
            parameters = NO_PARAMETERS
        if not isinstance(parameters, dict):
            raise ToolInputError(f"{here}.function.parameters", "must be a JSON schema object")
        if parameters.get("type", "object") != "object":
            raise ToolInputError(f"{here}.function.parameters.type", "the arguments must be an object")
        strict = fn.get("strict", False)
        if not isinstance(strict, bool):
            raise ToolInputError(f"{here}.function.strict", "must be a boolean")
        try:
            text = json.dumps(parameters, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:  # a value JSON cannot write: a set, bytes, NaN or Infinity
            where = non_finite_path(parameters, f"{here}.function.parameters")
            if where is not None:  # the grammar read it as null: a const NaN forced the call {"x": null}
                raise ToolInputError(where, "NaN and Infinity are not JSON numbers") from None
            raise ToolInputError(f"{here}.function.parameters", f"is not JSON ({e})") from None
        except RecursionError:  # as a call's arguments nested past the encoder's reach (messages.py)
            raise ToolInputError(f"{here}.function.parameters", "is nested too deeply to read") from None
        out.append(ToolSpec(name, description, text, strict))
    return tuple(out)


def _refuse_unknown(given: dict[Any, Any], fields: tuple[str, ...], where: str, what: str) -> None:
    """A ToolInputError naming the first key of `given` (sorted) that is none of `fields`."""
    unknown = sorted(str(k) for k in given if k not in fields)
    if unknown:
        raise ToolInputError(f"{where}.{unknown[0]}", f"unrecognized field of {what} (its fields: {', '.join(fields)})")


def normalize_tool_choice(choice: Any, tools: Sequence[ToolSpec], path: str = "tool_choice") -> ToolChoice:
    """The tool_choice as a `ToolChoice`; None means "auto" with tools and "none" without (OpenAI's defaults)."""
    choice = _as_dict(choice)
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ToolInputError(path, f"must be 'none', 'auto', 'required' or a named function, got {choice!r}")
        if choice == "required" and not tools:
            raise ToolInputError(path, "'required' needs at least one tool")
        return ToolChoice(choice)
    if isinstance(choice, dict):
        fn = _as_dict(choice.get("function"))
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type", "function") != "function" or not isinstance(name, str):
            raise ToolInputError(path, 'a named choice is {"type": "function", "function": {"name": ...}}')
        _refuse_unknown(choice, ("type", "function"), path, "a named tool choice")
        _refuse_unknown(fn, ("name",), f"{path}.function", "a named tool choice's function")
        if name not in {t.name for t in tools}:
            raise ToolInputError(f"{path}.function.name", f"{name!r} is not one of the tools")
        return ToolChoice("function", name)
    raise ToolInputError(path, f"must be a string or an object, got {type(choice).__name__}")
