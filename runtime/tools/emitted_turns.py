"""Replies a template renders itself, put back as the model emitted them.

Command R7B's template wraps a plain reply in `<|START_RESPONSE|>` and numbers each tool result by its call's place in
the history, so a remembered reply cannot be given to it as plain text (runtime/tools/render.py): its calls render
through the template, as `<|START_THINKING|>plan<|END_THINKING|><|START_ACTION|>[...]<|END_ACTION|>` in its own
spacing and numbering, which is not what the model wrote (no thinking, other spacing or numbers, a split of its own).
The next prompt then missed the cache from that reply on. So such a reply is an `EmittedTurn`, and `place_emitted`
replaces what the template printed for it, from the end of its generation prompt to its end of turn, by the text of
the ids the model emitted, as a span `Tokenizer.encode` splices those ids into (runtime/tools/known_tokens.py).

Where the reply lies is found in one more render of the history: each such reply's plan (which the template prints in
the reply, as `tool_plan`) given as a mark of letters and digits. The reply begins after the last generation prompt
before its mark and ends at the first end of turn after it; a probe (a one-turn chat with the first such reply) checks
that the template prints neither inside a reply, and a reply whose own fields (plan, names, arguments) spell one
keeps the template's text, as does every reply when the template does not print each mark as given. The prompt is
then right, and misses the cache from that reply on.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from radixcache.runtime.tools.known_tokens import KnownSpan, PromptText

Render = Callable[[list[dict[str, Any]], bool], str]


class EmittedTurn(dict):  # type: ignore[type-arg]
    """A message dict the template renders as it is, calls and all, whose whole reply the model emitted as
    `token_ids` (`place_emitted` puts them in place of what the template printed for it)."""

    token_ids: tuple[int, ...] = ()


def place_emitted(
    text: str, messages: Sequence[dict[str, Any]], render: Render, spell: Callable[[Sequence[int]], str],
    ends: Sequence[str],
) -> str:  # fmt: skip
    """`text` (`render(messages, add_generation_prompt)`) with each EmittedTurn's reply as `spell(token_ids)`, a span
    of those ids (the module docstring says where the reply is found, and when it keeps the template's text); `ends`:
    the stop tokens' texts."""
    turns = [(i, m) for i, m in enumerate(messages) if isinstance(m, EmittedTurn) and m.token_ids]
    ends = [e for e in ends if e]
    opening = _generation_prompt(render, turns[0][1], ends) if turns and ends else None
    if opening is None:
        return text
    base = f"q{uuid.uuid4().hex}"
    marks = {i: f"{base}n{i}q" for i, _ in turns}
    try:
        marked = render([{**m, "content": marks[i], "tool_plan": marks[i]} if i in marks else m
                         for i, m in enumerate(messages)], True)  # fmt: skip
    except Exception:
        return text
    where = _plans_in(text, marked, re.compile(re.escape(base) + r"n(\d+)q"), dict(turns))
    if where is None:
        return text
    out: list[str] = []
    spans: list[KnownSpan] = []
    pos = length = 0
    for i, m in turns:
        plan = m.get("content") or ""
        fields = plan + json.dumps(m.get("tool_calls"), ensure_ascii=False)
        if i not in where or any(s in fields for s in (opening, *ends)):
            continue
        start = text.rfind(opening, pos, where[i])
        stops = [at for at in (text.find(e, where[i] + len(plan)) for e in ends) if at >= 0]
        if start < 0 or not stops:
            continue
        start += len(opening)
        emitted = spell(m.token_ids)
        out += [text[pos:start], emitted]
        length += start - pos
        spans.append(KnownSpan(length, length + len(emitted), tuple(m.token_ids)))
        length += len(emitted)
        pos = min(stops)
    if not spans:
        return text
    out.append(text[pos:])
    return PromptText("".join(out), spans)


def _generation_prompt(render: Render, turn: dict[str, Any], ends: Sequence[str]) -> str | None:
    """The text a template opens a reply with (its generation prompt), where a reply as `turn` holds neither it nor
    an end of turn before the one that closes it; None for a template that does not lay replies out so."""
    ask = [{"role": "user", "content": "u"}]
    try:
        bare, asked, answered = render(ask, False), render(ask, True), render([*ask, dict(turn)], False)
    except Exception:
        return None
    opening = asked[len(bare) :]
    if not (opening and asked.startswith(bare) and answered.startswith(asked)):
        return None
    body = answered[len(asked) :]
    end = next((e for e in ends if body.endswith(e)), None)
    if end is None or opening in body or any(e in body[: -len(end)] for e in ends):
        return None
    return opening


def _plans_in(
    text: str, marked: str, pattern: re.Pattern[str], turns: dict[int, dict[str, Any]]
) -> dict[int, int] | None:
    """Where in `text` each turn's first printed plan begins, found by its mark in `marked`; None unless `marked`
    with each mark as its turn's plan is `text` (the template printed each plan as given)."""
    out: list[str] = []
    where: dict[int, int] = {}
    pos = length = 0
    for found in pattern.finditer(marked):
        i = int(found.group(1))
        if i not in turns:
            return None
        plan = turns[i].get("content") or ""
        out.append(marked[pos : found.start()])
        length += found.start() - pos
        where.setdefault(i, length)
        out.append(plan)
        length += len(plan)
        pos = found.end()
    out.append(marked[pos:])
    return where if "".join(out) == text else None
