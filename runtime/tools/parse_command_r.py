"""Tool calls out of Cohere Command-R output, streamed or whole: the machine `ToolCallParser` runs for the formats
"command_r" (Command-R and Command-R+) and "command_r7b" (Command R7B), with the same deltas (runtime.tools.parse).

- "command_r": content, then `Action:` and a fenced JSON list of calls: ``Action: ```json\\n[{"tool_name": ...,
  "parameters": {...}}, ...]\\n``` `` (the fence may be missing, or plain ```` ``` ````).
- "command_r7b": content (the tool plan the model thinks aloud, and a plain answer: their `<|START_THINKING|>` and
  `<|START_RESPONSE|>` markers are special tokens the text leaves out, and are dropped where a tokenizer shows them),
  then `<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}},
  ...]<|END_ACTION|>`. The model's `tool_call_id` (an index) is dropped: each call gets a fresh OpenAI id, as in every
  format (the template numbers the calls of a history again itself).
Calls whose keys come in that order stream their arguments as they arrive; a block in another shape (other key
order, `name` / `arguments` keys, arguments as text) is held until it closes, then read whole; a block that holds no
call of a given tool stays content, and so does `Action:` followed by anything but a list. Whitespace after a block is
dropped; text after it is content again (another block may follow). Cut short (a length limit) inside the arguments,
they stay cut short; after a call's name, before its arguments open, it is that call with empty arguments.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from radixcache.runtime.tools import scan
from radixcache.runtime.tools.call_deltas import argument_piece, open_call
from radixcache.runtime.tools.messages import STRICT_JSON

COMMAND_R, COMMAND_R7B = "command_r", "command_r7b"
ACTION = "Action:"  # Command-R / R+: the text before its fenced list of calls
FENCES = ("```json", "```")
START_ACTION, END_ACTION = "<|START_ACTION|>", "<|END_ACTION|>"  # R7B's special tokens around its list of calls
# R7B's markers around its plan and its answer: special tokens the decoded text leaves out; a tokenizer that has them
# as plain tokens shows them, and they are no content either
HIDDEN = ("<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>")


class CommandRCalls:
    """The state of one output's parse; `ToolCallParser` feeds it and reads `content`, `calls`, `parts`, `state` and
    `dropped_calls` back (the same shapes as its own)."""

    def __init__(
        self, names: set[str], fmt: str, new_id: Callable[[], str], max_calls: int | None, calls_only: bool
    ) -> None:
        self.names = names
        self.r7b = fmt == COMMAND_R7B
        self.open = START_ACTION if self.r7b else ACTION
        self.close = END_ACTION if self.r7b else "```"
        self.new_id, self.max_calls, self.calls_only = new_id, max_calls, calls_only
        self.longest_name = 2 + 6 * max((len(n) for n in names), default=0)
        self.parts: list[str] = []
        self.pending: list[str] = []
        self.tail = ""  # the output's last characters, where a close marker split across deltas begins
        self.text = ""
        self.pos = 0  # everything before pos has been decided
        self.held = 0  # where the block being read began (its open marker)
        self.listed = 0  # where the block's list began (its `[`)
        self.state = "text"
        self.calls: list[tuple[str, str, list[str]]] = []
        self.content: list[str] = []
        self.scanner = scan.ValueScanner()
        self.ws: scan.Memo = {}
        self.dropped_calls = False

    def feed(self, delta: str, final: bool) -> list[dict[str, Any]]:
        self.parts.append(delta)
        joined = self.tail + delta
        self.tail = joined[-(len(self.close) - 1) :]
        # a delta that can decide nothing (after the calls; in a held block, no close marker begun or ended in it)
        # waits unjoined, so a long held text is not copied once per delta
        if not final and (self.state == "done" or (self.state == "block" and self.close not in joined)):
            self.pending.append(delta)
            return []
        delta, self.pending = "".join(self.pending) + delta, []
        # the decided text is dropped once it is half the window, so each character is copied a bounded number of
        # times (the work stays linear in the output's length); a block being read keeps its start
        cut = min(self.pos, self.held, self.listed) if self.state in ("head", "item", "block") else self.pos
        if cut and 2 * cut >= len(self.text):
            self.text = self.text[cut:]
            self.pos, self.held, self.listed = self.pos - cut, max(self.held - cut, 0), max(self.listed - cut, 0)
            self.ws.clear()
        self.text += delta
        out: list[dict[str, Any]] = []
        while True:
            before = (self.state, self.pos)
            getattr(self, "_" + self.state)(out, final)
            if (self.state, self.pos) == before:
                return out
            self.ws.clear()

    # ------------------------------------------------------------------ the machine

    def _emit(self, out: list[dict[str, Any]], text: str) -> None:
        if text and not self.calls_only:
            self.content.append(text)
            out.append({"content": text})

    def _text(self, out: list[dict[str, Any]], final: bool) -> None:
        i = self.text.find(self.open, self.pos)
        hidden = self._hidden_at(i)
        if hidden is not None:  # R7B's thinking or response marker, written as text: not content
            self._emit(out, self.text[self.pos : hidden[0]])
            self.pos = self.held = hidden[0] + len(hidden[1])
            return
        if i >= 0:
            self._emit(out, self.text[self.pos : i])
            self.held, self.pos, self.state = i, i + len(self.open), "head"
            return
        markers = (self.open, *HIDDEN) if self.r7b else (self.open,)
        keep = 0 if final else max(self._prefix_kept(m) for m in markers)
        end = len(self.text) - keep
        if end > self.pos:
            self._emit(out, self.text[self.pos : end])
            self.pos = self.held = end

    def _hidden_at(self, before: int) -> tuple[int, str] | None:
        """The first of R7B's thinking and response markers from `pos` (before `before`, where that is not -1)."""
        if not self.r7b:
            return None
        found = [(j, m) for m in HIDDEN if (j := self.text.find(m, self.pos, None if before < 0 else before)) >= 0]
        return min(found) if found else None

    def _prefix_kept(self, marker: str) -> int:
        """How many of the text's last characters begin `marker` (held back: the marker may be arriving)."""
        return next((k for k in range(len(marker) - 1, 0, -1) if self.text.endswith(marker[:k])), 0)

    def _head(self, out: list[dict[str, Any]], final: bool) -> None:
        """After the open marker: the list's `[` (R / R+: after a fence, where there is one)."""
        openings = [["["]] if self.r7b else [[fence, "["] for fence in FENCES] + [["["]]
        tried = [scan.literals(self.text, self.pos, lits, self.ws) for lits in openings]
        done = next((end for status, end in tried if status == "ok"), None)
        if done is not None:
            self.listed, self.pos, self.state = done - 1, done, "item"
        elif all(status == "no" for status, _ in tried) or final:
            if self.r7b:  # the block's own markers say where it ends: read it whole
                self.listed, self.state = self.pos, "block"
            else:  # `Action:` said in passing: content
                self._emit(out, self.text[self.held : self.pos])
                self.state = "text"

    def _item(self, out: list[dict[str, Any]], final: bool) -> None:
        if self.max_calls is not None and len(self.calls) >= self.max_calls:
            self.state, self.dropped_calls = "done", True
            return
        status, p = scan.literals(self.text, self.pos, ["{"], self.ws)
        if status == "ok" and self.r7b:  # the model's own index, which no client sees (where it comes first)
            index, q = scan.literals(self.text, p, ['"tool_call_id"', ":"], self.ws)
            if index == "ok":
                status, q, _ = scan.string(self.text, q, 64, self.ws)
                status, p = scan.literals(self.text, q, [","], self.ws) if status == "ok" else (status, p)
            elif index == "more":
                status = "more"
        name = ""
        if status == "ok":
            status, p = scan.literals(self.text, p, ['"tool_name"', ":"], self.ws)
        if status == "ok":
            status, p, name = scan.string(self.text, p, self.longest_name, self.ws)
        if status == "ok":
            status, p = scan.literals(self.text, p, [",", '"parameters"', ":"], self.ws)
        if status == "ok":
            p = scan.skip_ws(self.text, p, self.ws)
            status = "more" if p >= len(self.text) else "ok" if self.text[p] == "{" else "no"
        if name and name not in self.names:
            status = "no"
        if status == "ok":
            self._head_delta(out, name)
            self.pos, self.state, self.scanner = p, "args", scan.ValueScanner()
        elif status == "more" and final and name:  # cut after the name, before the arguments opened
            self._head_delta(out, name)
            self.pos, self.state = len(self.text), "done"
        elif status == "no" or final:
            self.state = "done" if self.calls else "block"

    def _head_delta(self, out: list[dict[str, Any]], name: str) -> None:
        """A new call's first delta: its id, type and name, its arguments still empty."""
        out.append(open_call(self.calls, self.new_id(), name))

    def _args(self, out: list[dict[str, Any]], final: bool) -> None:
        end, closed = self.scanner.feed(self.text, self.pos)
        piece = self.text[self.pos : end]
        if piece:
            out.append(argument_piece(self.calls, piece))
        self.pos = end
        if closed:
            self.state = "next"

    def _next(self, out: list[dict[str, Any]], final: bool) -> None:
        tried = [(scan.literals(self.text, self.pos, lits, self.ws), state) for lits, state in
                 ((["}", ","], "item"), (["}", "]"], "end"))]  # fmt: skip
        for (status, end), state in tried:
            if status == "ok":
                self.pos, self.state = end, state
                return
        if final or all(status == "no" for (status, _), _ in tried):
            self.state = "done"  # calls are out: what follows in another shape is ignored (it stays in `raw`)

    def _end(self, out: list[dict[str, Any]], final: bool) -> None:
        """After the list: its close marker, where written; then what follows is content again."""
        status, end = scan.literals(self.text, self.pos, [self.close], self.ws)
        if status == "more" and not final:
            return
        self.pos = end if status == "ok" else self.pos
        self.state = "between"

    def _between(self, out: list[dict[str, Any]], final: bool) -> None:
        p = scan.skip_ws(self.text, self.pos, self.ws)
        if p < len(self.text) or final:
            self.pos, self.held, self.state = p, p, "text"

    def _block(self, out: list[dict[str, Any]], final: bool) -> None:
        """A block in another shape: held until its close marker (or the end), then read whole."""
        i = self.text.find(self.close, max(self.pos, self.listed))
        if i < 0 and not final:
            self.pos = max(self.listed, len(self.text) - len(self.close) + 1)  # where the marker may yet begin
            return
        end = len(self.text) if i < 0 else i + len(self.close)
        calls = loose_command_r(self.text[self.listed : i if i >= 0 else end], self.names)
        if calls is None:
            self._emit(out, self.text[self.held : end])
        else:
            room = None if self.max_calls is None else max(self.max_calls - len(self.calls), 0)
            self.dropped_calls |= room is not None and len(calls) > room
            for name, arguments in calls[:room]:
                self.calls.append((self.new_id(), name, [arguments]))
                fn = {"name": name, "arguments": arguments}
                head = {"index": len(self.calls) - 1, "id": self.calls[-1][0], "type": "function", "function": fn}
                out.append({"tool_calls": [head]})
        self.pos, self.state = end, "between" if calls else "text"
        self.held = end

    def _done(self, out: list[dict[str, Any]], final: bool) -> None:
        self.pos = len(self.text)


def loose_command_r(text: str, names: set[str]) -> list[tuple[str, str]] | None:
    """(name, arguments JSON) for a JSON list (or one object) of calls of known tools, each `{"tool_name",
    "parameters"}` (or `name` / `arguments`; a `tool_call_id` is ignored; arguments an object or its text); else
    None. The text may end in a fence (```` ``` ````) or hold it before the list."""
    body = text.strip()
    for fence in FENCES:
        body = body.removeprefix(fence).strip()
    try:
        value, _ = STRICT_JSON.raw_decode(body)
    except (ValueError, RecursionError):
        return None
    out = []
    for item in value if isinstance(value, list) else [value]:
        name = item.get("tool_name", item.get("name")) if isinstance(item, dict) else None
        if not isinstance(name, str) or name not in names:
            return None
        args = item.get("parameters", item.get("arguments", {}))
        if isinstance(args, str):
            try:
                args = STRICT_JSON.decode(args)
            except (ValueError, RecursionError):
                return None
        if not isinstance(args, dict):
            return None
        try:  # re-serialised: a number past the doubles would be written Infinity, which is no JSON
            out.append((name, json.dumps(args, ensure_ascii=False, allow_nan=False)))
        except (ValueError, RecursionError):
            return None
    return out or None
