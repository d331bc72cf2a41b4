"""Tool calls out of model output, streamed or whole, as OpenAI returns them.

`ToolCallParser(tools, fmt)` is fed the output text as it is decoded and returns OpenAI's streamed deltas:
`{"content": text}`, then per call `{"tool_calls": [{"index", "id", "type": "function", "function": {"name",
"arguments": ""}}]}` once its name is known, then `{"tool_calls": [{"index", "function": {"arguments": piece}}]}`
as the arguments arrive. `parse_tool_calls` is the same machine fed the whole text, so streamed deltas always
assemble to the non-streamed result.

Formats (`TemplateFeatures.format`):
- "generic" and "native": the output is a call when it starts (after whitespace) with `{"tool_calls": [` and each
  call is `{"name": ..., "arguments": {...}}` in that order; the arguments text is returned exactly as written.
  Other JSON that still describes calls (keys in another order, a bare `{"name", "arguments" | "parameters"}`, a
  list of them as Mistral's templates have the model write, after its `[TOOL_CALLS]` or not, the arguments as a
  string) is accepted once the output ends, with the arguments re-serialised. Any other output is content; an
  output that starts with `{` or `[` is held back until it ends, to decide.
- "hermes": content, then calls each in `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; whitespace
  between calls is dropped; a tag whose JSON is not a call stays content.
- "command_r" and "command_r7b" (Cohere's `Action: ```json [...]``` ` and `<|START_ACTION|>[...]<|END_ACTION|>`):
  runtime/tools/parse_command_r.py, fed through this parser.
A call naming no given tool is not a call. In the generic format, once a call is out, malformed text after it
is ignored (it stays in `raw`). Output cut short inside the arguments leaves them cut short, as OpenAI does at
finish_reason "length"; cut after a call's name, before its arguments open, it is that call with empty arguments.
Under `calls_only` (a grammar allowed calls alone: "required", a named function) nothing is content: an output cut
before any call's name is no call and no content, as OpenAI returns no content for a required call; under a named
function (`forced`) it is that function's call with empty arguments, as OpenAI returns it at any max_tokens.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from radixcache.runtime.tools import scan
from radixcache.runtime.tools.call_deltas import argument_piece, open_call
from radixcache.runtime.tools.cut_calls import MISTRAL_CALLS, cut_call
from radixcache.runtime.tools.json_values import json_object
from radixcache.runtime.tools.messages import STRICT_JSON, ToolCall
from radixcache.runtime.tools.parse_command_r import COMMAND_R, COMMAND_R7B, CommandRCalls
from radixcache.runtime.tools.specs import ToolSpec

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FORMATS = ("generic", "native", "hermes", COMMAND_R, COMMAND_R7B)  # TemplateFeatures.format's values


def new_call_id() -> str:
    """`call_` and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ParsedOutput:
    """content (None when empty), the calls, the text exactly as the model wrote it, and whether every call's
    arguments closed as a JSON object (False when the output ended inside them: a length limit, a stop string; or
    when they are not JSON: NaN, a trailing comma)."""

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    raw: str
    complete: bool = True
    dropped_calls: bool = False  # calls past `max_calls` were written and left out (they stay in `raw`)

    def finish_reason(self, reason: str) -> str:
        """ "tool_calls" when there are calls, all whole JSON objects, and generation ended by itself; else `reason`
        ("length" stays, and so does "stop" when a stop string cut a call short or its arguments are not JSON: a
        client cannot run it)."""
        return "tool_calls" if self.tool_calls and self.complete and reason == "stop" else reason

    def message(self) -> dict[str, Any]:
        """The assistant message OpenAI returns."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return out


class ToolCallParser:
    def __init__(
        self,
        tools: Iterable[ToolSpec],
        fmt: str = "generic",
        *,
        new_id: Callable[[], str] = new_call_id,
        max_calls: int | None = None,
        calls_only: bool = False,
        forced: str | None = None,
    ) -> None:
        """`max_calls`: the most calls read (1 for `parallel_tool_calls: false`, which an unconstrained model does
        not always obey); the output after the last one read is ignored (it stays in `raw`). `calls_only`: a grammar
        made the output calls alone ("required" and named tool_choices), so none of it is content, not even a
        fragment of the calls' scaffold that the length limit cut before any call's name (no call then). `forced`:
        the function a named tool_choice calls; an output that ends before its call's name (the length limit cut
        the scaffold) is that call with empty arguments, as the name is the request's."""
        if fmt not in FORMATS:
            raise ValueError(f"unknown tool call format {fmt!r}")
        self.names = {t.name for t in tools}
        # Command-R's formats run a machine of their own (runtime/tools/parse_command_r.py), fed through this one
        cohere = fmt in (COMMAND_R, COMMAND_R7B)
        self.command_r = CommandRCalls(self.names, fmt, new_id, max_calls, calls_only) if cohere else None
        self.hermes = fmt == "hermes"
        self.new_id = new_id
        self.max_calls = max_calls
        self.calls_only = calls_only
        self.forced = forced
        self.dropped_calls = False
        # The text is read through a window: `text` holds the output from where the window starts, `pos` and `held`
        # are offsets into it. The decided text before both is dropped from time to time, and a delta that can
        # decide nothing (see `_waits`) waits in `pending` unjoined, so no delta copies or scans the whole output
        # again: the work is linear in the output's length. `parts` keep the whole output for `raw`.
        self.parts: list[str] = []
        self.pending: list[str] = []
        self.tail = ""  # the output's last characters, where a close tag split across deltas begins
        self.text = ""
        self.pos = 0  # everything before pos has been decided
        self.held = 0  # start of the text held back (a call in the making)
        self.state = "text" if self.hermes else "start"
        self.calls: list[tuple[str, str, list[str]]] = []  # id, name, the arguments' pieces
        # a name longer than any tool's, each character written as a \uXXXX escape, is no tool's: not read on
        self.longest_name = 2 + 6 * max((len(n) for n in self.names), default=0)
        self.content: list[str] = []
        self.scanner = scan.ValueScanner()
        self.ws: scan.Memo = {}  # whitespace runs read at this state and pos (scan.py), offsets into `text`
        self.finished = False

    # ------------------------------------------------------------------ public

    def feed(self, delta: str) -> list[dict[str, Any]]:
        """The deltas `delta` completes."""
        if self.finished:
            raise RuntimeError("the output has finished")
        if self.command_r is not None:
            return self.command_r.feed(delta, final=False)
        self.parts.append(delta)
        self.pending.append(delta)
        if self._waits(delta):
            return []
        self._take()
        out: list[dict[str, Any]] = []
        self._run(out, final=False)
        return out

    def finish(self) -> list[dict[str, Any]]:
        """The deltas the end of the output decides (held text, calls found only in the whole text)."""
        if self.command_r is not None:
            out = self.command_r.feed("", final=True)
        else:
            self._take()
            out = []
            self._run(out, final=True)
        self.finished = True
        machine: ToolCallParser | CommandRCalls = self if self.command_r is None else self.command_r
        if self.forced is not None and not machine.calls:  # cut before the name: the request named the function
            out.append(open_call(machine.calls, self.new_id(), self.forced))
        return out

    def result(self) -> ParsedOutput:
        machine: ToolCallParser | CommandRCalls = self if self.command_r is None else self.command_r
        content = "".join(machine.content)
        calls = tuple(ToolCall(i, n, "".join(a)) for i, n, a in machine.calls)
        # args: still open; arguments that closed but are no JSON object (NaN, a trailing comma: an unconstrained
        # model's slip) cannot be run either
        complete = machine.state != "args" and all(json_object(c.arguments) for c in calls)
        raw = "".join(machine.parts)
        return ParsedOutput(content or None, calls, raw, complete=complete, dropped_calls=machine.dropped_calls)

    # ------------------------------------------------------------------ the window

    def _waits(self, delta: str) -> bool:
        """Whether `delta` can decide nothing yet: after the calls (ignored), in JSON held to the end, or in a Hermes
        tag held until its close tag, which neither `delta` nor the characters before it begin."""
        joined = self.tail + delta
        self.tail = joined[-(len(CLOSE) - 1) :]
        return self.state in ("done", "hold") or (self.state == "block" and CLOSE not in joined)

    def _take(self) -> None:
        """The pending deltas joined to the window, its decided start dropped first once it is half the window (so
        each character is copied a bounded number of times)."""
        cut = min(self.pos, self.held)
        if cut and 2 * cut >= len(self.text):
            self.text, self.pos, self.held = self.text[cut:], self.pos - cut, self.held - cut
            self.ws.clear()
        if self.pending:
            self.text += "".join(self.pending)
            self.pending.clear()

    # ------------------------------------------------------------------ the machine

    def _run(self, out: list[dict[str, Any]], final: bool) -> None:
        while True:
            before = (self.state, self.pos)
            getattr(self, "_" + self.state)(out, final)
            if (self.state, self.pos) == before:
                return
            self.ws.clear()  # kept only while the machine waits at one place for more text

    def _emit_content(self, out: list[dict[str, Any]], text: str) -> None:
        if text and not self.calls_only:
            self.content.append(text)
            out.append({"content": text})

    def _start(self, out: list[dict[str, Any]], final: bool) -> None:
        status, end = scan.literals(self.text, self.pos, ["{", '"tool_calls"', ":", "["], self.ws)
        if status == "ok":
            self.pos, self.state = end, "call"
        elif status == "no" or final:
            self._give_up(out, final)

    def _call(self, out: list[dict[str, Any]], final: bool) -> None:
        if self._room() == 0:  # another call begins past max_calls
            self.state, self.dropped_calls = "done", True
            return
        status, p = scan.literals(self.text, self.pos, ["{", '"name"', ":"], self.ws)
        name = ""
        if status == "ok":
            status, p, name = scan.string(self.text, p, self.longest_name, self.ws)
        if status == "ok":
            status, p = scan.literals(self.text, p, [",", '"arguments"', ":"], self.ws)
        if status == "ok":
            p = scan.skip_ws(self.text, p, self.ws)
            status = "more" if p >= len(self.text) else "ok" if self.text[p] == "{" else "no"
        if name and name not in self.names:
            status = "no"
        if status == "ok":
            self._head(out, name)
            self.pos, self.state, self.scanner = p, "args", scan.ValueScanner()
        elif status == "more" and final and name:  # cut (a length limit) after the name, before the arguments
            self._head(out, name)  # opened: the call, with no arguments, as when cut inside them
            self.pos, self.state = len(self.text), "done"
        elif status == "no" or final:
            self._give_up(out, final)

    def _head(self, out: list[dict[str, Any]], name: str) -> None:
        """A new call's first delta: its id, type and name, its arguments still empty."""
        out.append(open_call(self.calls, self.new_id(), name))

    def _args(self, out: list[dict[str, Any]], final: bool) -> None:
        end, closed = self.scanner.feed(self.text, self.pos)
        piece = self.text[self.pos : end]
        if piece:
            out.append(argument_piece(self.calls, piece))
        self.pos = self.held = end  # a call is out: nothing before it is held any more
        if closed:
            self.state = "close"

    def _close(self, out: list[dict[str, Any]], final: bool) -> None:
        if self.hermes:
            status, end = scan.literals(self.text, self.pos, ["}", CLOSE], self.ws)
            if status == "ok":
                self.pos, self.held, self.state = end, end, "between"
            elif status == "no" or final:
                self.state = "done"
            return
        tried = [
            (scan.literals(self.text, self.pos, lits, self.ws), state)
            for lits, state in ((["}", ","], "call"), (["}", "]", "}"], "done"))
        ]
        for (status, end), state in tried:
            if status == "ok":
                self.pos, self.state = end, state
                return
        if final or all(status == "no" for (status, _), _ in tried):
            self.state = "done"

    def _done(self, out: list[dict[str, Any]], final: bool) -> None:
        self.pos = self.held = len(self.text)

    def _plain(self, out: list[dict[str, Any]], final: bool) -> None:
        self._emit_content(out, self.text[self.pos :])
        self.pos = self.held = len(self.text)

    def _hold(self, out: list[dict[str, Any]], final: bool) -> None:
        if final:
            self._loose(out, self.text[self.held :], self.text[self.held :], cut=True)
            self.pos, self.state = len(self.text), "done"

    def _give_up(self, out: list[dict[str, Any]], final: bool) -> None:
        """The calls in the making are not in the expected shape: decide what the held text is."""
        if self.hermes:  # each tag stands alone: this one is decided when it closes
            self.state = "block"
        elif self.calls:  # calls are out: the rest is ignored
            self.state = "done"
        elif self.text[self.held :].lstrip().startswith(("{", "[")):
            self.state = "hold"  # JSON in another shape, perhaps calls: decided at the end
            if final:
                self._hold(out, final)
        else:
            self.pos, self.state = self.held, "plain"

    def _room(self) -> int | None:
        """How many more calls may be read (None: any number)."""
        return None if self.max_calls is None else max(self.max_calls - len(self.calls), 0)

    # ------------------------------------------------------------------ hermes

    def _text(self, out: list[dict[str, Any]], final: bool) -> None:
        i = self.text.find(OPEN, self.pos)
        if i >= 0:
            self._emit_content(out, self.text[self.pos : i])
            self.held, self.pos, self.state = i, i + len(OPEN), "call"
            return
        keep = 0 if final else next((k for k in range(len(OPEN) - 1, 0, -1) if self.text.endswith(OPEN[:k])), 0)
        end = len(self.text) - keep
        if end > self.pos:
            self._emit_content(out, self.text[self.pos : end])
            self.pos = self.held = end

    def _between(self, out: list[dict[str, Any]], final: bool) -> None:
        p = scan.skip_ws(self.text, self.pos, self.ws)
        if p < len(self.text) or final:
            self.pos, self.state = p, "text"

    def _block(self, out: list[dict[str, Any]], final: bool) -> None:
        i = self.text.find(CLOSE, self.pos)
        if i < 0 and not final:
            return
        end = len(self.text) if i < 0 else i + len(CLOSE)
        called = self._loose(out, self.text[self.pos : i if i >= 0 else end], self.text[self.held : end], i < 0)
        self.pos, self.held = end, end
        self.state = "done" if i < 0 else "between" if called else "text"

    def _loose(self, out: list[dict[str, Any]], body: str, whole: str, cut: bool = False) -> bool:
        """Calls from JSON in any accepted shape, emitted whole (True); else `whole` is content (False). `cut`: the
        output ended in `body`, so a call it ended inside is that call, its arguments as written (`cut_call`)."""
        calls = loose_calls(body, self.names)
        if calls is None and cut and (one := cut_call(body, self.names)) is not None and self._room() != 0:
            self._head(out, one[0])
            if one[1]:
                out.append(argument_piece(self.calls, one[1]))
            return True
        if calls is None:
            self._emit_content(out, whole)
            return False
        room = self._room()
        self.dropped_calls |= room is not None and len(calls) > room
        for name, arguments in calls[:room]:
            call_id = self.new_id()
            self.calls.append((call_id, name, [arguments]))
            fn = {"name": name, "arguments": arguments}
            out.append(
                {"tool_calls": [{"index": len(self.calls) - 1, "id": call_id, "type": "function", "function": fn}]}
            )
        return True


def loose_calls(text: str, names: set[str]) -> list[tuple[str, str]] | None:
    """(name, arguments JSON) for JSON text that describes calls of known tools: {"tool_calls": [...]}, a list of
    calls or one call, each {"name", "arguments" | "parameters"} (arguments an object or its text), after Mistral's
    `[TOOL_CALLS]` where it is written; else None.
    Model output: nesting too deep to decode is not a call, nor is a name that is not a string, nor arguments
    holding NaN or Infinity (not JSON), nor arguments JSON cannot write back (an integer past int()'s 4,300 digits, a
    number past the doubles, which json.dumps writes as Infinity)."""
    body = text.strip()
    if body.startswith(MISTRAL_CALLS):
        body = body[len(MISTRAL_CALLS) :].lstrip()
    try:
        value, _ = STRICT_JSON.raw_decode(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(value, dict) and "tool_calls" in value:
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or item["name"] not in names:
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = STRICT_JSON.decode(args)
            except (ValueError, RecursionError):
                return None
        if not isinstance(args, dict):
            return None
        try:  # re-serialised: a number past the doubles (1e999) would be written Infinity, which is no JSON
            out.append((item["name"], json.dumps(args, ensure_ascii=False, allow_nan=False)))
        except (ValueError, RecursionError):
            return None
    return out or None


def parse_tool_calls(
    text: str,
    tools: Iterable[ToolSpec],
    fmt: str = "generic",
    *,
    new_id: Callable[[], str] = new_call_id,
    max_calls: int | None = None,
    calls_only: bool = False,
    forced: str | None = None,
) -> ParsedOutput:
    """The whole output at once: exactly what the streamed deltas of `ToolCallParser` assemble to."""
    parser = ToolCallParser(tools, fmt, new_id=new_id, max_calls=max_calls, calls_only=calls_only, forced=forced)
    parser.feed(text)
    parser.finish()
    return parser.result()


def assemble(deltas: Iterable[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """Content and calls from streamed deltas, the way an OpenAI client assembles them."""
    content, calls = "", {}
    for d in deltas:
        content += d.get("content") or ""
        for tc in d.get("tool_calls", ()):
            call = calls.setdefault(
                tc["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            call["id"] = tc.get("id") or call["id"]
            call["function"]["name"] += tc.get("function", {}).get("name", "")
            call["function"]["arguments"] += tc.get("function", {}).get("arguments", "")
    return content or None, [calls[i] for i in sorted(calls)]
