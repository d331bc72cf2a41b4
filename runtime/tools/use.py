"""`ToolUse`: a request's tools, tool_choice and parallel_tool_calls, validated once into one frozen object.

It is what travels with a request (`RequestOptions.tool_use`, set by the keywords `tools=`, `tool_choice=` and
`parallel_tool_calls=` of every Engine entry point), so the prompt is rendered with the tools, the grammar enforces
`required` and named choices, and the result carries the parsed calls, whichever door the request came through.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from radixcache.runtime.tools.errors import ToolInputError
from radixcache.runtime.tools.specs import ToolChoice, ToolSpec, normalize_tool_choice, normalize_tools

KEYWORDS = ("tools", "tool_choice", "parallel_tool_calls")


@dataclass(frozen=True)
class ToolUse:
    """tools: the functions, in the given order. choice: "none" (tools are shown, the output is not parsed for
    calls), "auto" (the model chooses; calls are parsed), "required" (at least one call) or "function" (exactly one
    call, of that function, as OpenAI's forced function: enforced by the grammar). parallel_tool_calls: False allows
    one call at most."""

    tools: tuple[ToolSpec, ...]
    choice: ToolChoice
    parallel_tool_calls: bool = True

    @property
    def parses_calls(self) -> bool:
        return self.choice.mode != "none" and bool(self.tools)

    @property
    def calls_only(self) -> bool:
        """The output is calls alone: "required" and a named function run under a grammar of the calls, so no part
        of it is content (a reply the length limit cut before any call's name has neither calls nor content)."""
        return self.choice.mode in ("required", "function")

    @property
    def forced(self) -> str | None:
        """The function a named tool_choice calls (None for the other choices): its name is the request's, so a
        reply the length limit cut before the call's name is still that call (`ToolCallParser`'s `forced`)."""
        return self.choice.name if self.choice.mode == "function" else None

    @property
    def one_call(self) -> bool:
        """At most one call: `parallel_tool_calls` false, or a named function (OpenAI's forced function calls it
        exactly once, whatever `parallel_tool_calls` says)."""
        return not self.parallel_tool_calls or self.choice.mode == "function"

    @property
    def max_calls(self) -> int | None:
        """The most calls a reply may carry: 1 for `one_call` (the parser keeps the first when an unconstrained
        "auto" model writes more), else None."""
        return 1 if self.one_call else None

    @classmethod
    def of(
        cls,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = None,
        parallel_tool_calls: bool | None = None,
    ) -> ToolUse | None:
        """From OpenAI's fields (tools as dicts or `ToolSpec`s); None when no tool is given and tool_choice is absent
        or "none". A bad field raises `ToolInputError` (a ValueError) naming it."""
        specs = _specs(tools)
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise ToolInputError("parallel_tool_calls", f"must be a boolean, got {parallel_tool_calls!r}")
        choice = normalize_tool_choice(tool_choice, specs)
        if not specs:
            if parallel_tool_calls is not None:
                raise ToolInputError("parallel_tool_calls", "needs tools")
            return None  # normalize_tool_choice refused "required" and named choices without tools
        return cls(specs, choice, True if parallel_tool_calls is None else parallel_tool_calls)

    def updated(self, **changes: Any) -> ToolUse | None:
        """These tools with some of the three keywords given again (the others kept)."""
        fields = {"tools": self.tools, "tool_choice": _choice_value(self.choice), "parallel_tool_calls": None}
        if "tool_choice" not in changes and "tools" in changes:
            # new tools keep the choice ("required" stays required), unless it names a function they lack or none
            # are left to choose from: then the default choice for them
            names = {t.name for t in _specs(changes["tools"])}
            if not names or (self.choice.mode == "function" and self.choice.name not in names):
                fields["tool_choice"] = None
        if "parallel_tool_calls" not in changes and changes.get("tools", self.tools):
            fields["parallel_tool_calls"] = self.parallel_tool_calls
        fields.update(changes)
        return ToolUse.of(**fields)


def _specs(tools: Sequence[Any] | None) -> tuple[ToolSpec, ...]:
    """Tools as `ToolSpec`s: given as such, or validated from OpenAI's format."""
    if isinstance(tools, (list, tuple)) and all(isinstance(t, ToolSpec) for t in tools):
        return tuple(tools)
    return normalize_tools(tools)


def _choice_value(choice: ToolChoice) -> Any:
    if choice.mode == "function":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.mode


ALPHANUMERIC = string.ascii_letters + string.digits


class CallIds:
    """`call_` + 16 random hex digits + a counter of 8: the same sequence for every parser of one request. With
    `length` (a template that demands ids of that length: TemplateFeatures.call_id_length, Mistral's 9), each id is
    that many letters and digits drawn from the seed and the counter instead, which such a template accepts when
    the client sends the calls back (`call_...` made every tool round trip a ChatTemplateError)."""

    def __init__(self, seed: str | None = None, length: int | None = None) -> None:
        self.seed = seed or secrets.token_hex(8)
        self.length = length

    def sequence(self) -> Callable[[], str]:
        """A fresh id generator (one per parser): call 0, 1, ... of this request."""
        count = itertools.count()
        if self.length is None:
            return lambda: f"call_{self.seed}{next(count):08x}"
        return lambda: alphanumeric_id(f"{self.seed}:{next(count)}", self.length or 0)


def alphanumeric_id(key: str, n: int) -> str:
    """`n` letters and digits drawn from `key` (a request's seed and a call's number: the same for every parser; a
    legacy call's position, runtime.server.legacy)."""
    return "".join(ALPHANUMERIC[b % len(ALPHANUMERIC)] for b in hashlib.shake_256(key.encode()).digest(n))
