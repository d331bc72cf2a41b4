"""Placing the remembered calls' ids in a long agent prompt does work linear in its text: each turn's mark was also
searched for again to the end of the marked render (to refuse a mark printed twice), so a prompt of N remembered
calls scanned it N times over: 3.5 s of a 1.4 MB prompt with 3,000 calls, at every turn of that agent.

The work is counted, not timed: the characters each `find` of the marked render scans. The spans are checked against
where each turn's content lies (a naive render that records the offsets), and a template printing a content twice
still falls back to the search (the second mark's copy is left in the text, which then differs)."""

from __future__ import annotations

from typing import Any

from radixcache.runtime.tools.known_tokens import KnownSpan, RememberedTurn, place_known


class CountedFinds(str):
    """A rendered text whose `find` counts the characters it scans (to its match's end, or to the end)."""

    scanned = 0

    def find(self, sub: str, start: Any = None, end: Any = None) -> int:  # type: ignore[override]
        at = super().find(sub, start, end)
        first = 0 if start is None else start
        CountedFinds.scanned += (at + len(sub) if at >= 0 else len(self)) - first
        return at


def agent_chat(calls: int) -> tuple[list[dict[str, Any]], list[KnownSpan]]:
    """An agent's history: each remembered call and its long result; with where each call's content is rendered by
    `plain` (recorded as it renders, not searched)."""
    chat: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i in range(calls):
        call = f'{{"name": "f", "arguments": {{"x": {i}}}}}'
        turn = RememberedTurn(role="assistant", content=f'{{"tool_calls": [{call}]}}')
        turn.token_ids = (i + 1,)
        chat += [turn, {"role": "tool", "content": "r" * 300}]
    spans, pos = [], 0
    for m in chat:
        pos += len(f"<{m['role']}>")
        if isinstance(m, RememberedTurn):
            spans.append(KnownSpan(pos, pos + len(m["content"]), m.token_ids))
        pos += len(m["content"])
    return chat, spans


def plain(chat: list[dict[str, Any]]) -> str:
    return CountedFinds("".join(f"<{m['role']}>{m['content']}" for m in chat))


def test_placing_many_remembered_calls_scans_the_marked_text_a_bounded_number_of_times() -> None:
    chat, spans = agent_chat(400)
    text = plain(chat)
    CountedFinds.scanned = 0
    placed = place_known(text, chat, plain)
    assert placed == text and placed.known == tuple(spans)
    assert CountedFinds.scanned <= 2 * len(text)  # the fix: once through; before it, about 200 times


def test_a_template_printing_a_remembered_content_twice_falls_back_to_the_search() -> None:
    def twice(chat: list[dict[str, Any]]) -> str:
        return "".join(f"<{m['role']}>{m['content']}" * (2 if m["role"] == "assistant" else 1) for m in chat)

    first = RememberedTurn(role="assistant", content="abc")
    first.token_ids = (7, 8)
    chat = [{"role": "user", "content": "x"}, first]
    placed = place_known(twice(chat), chat, twice)
    assert placed == "<user>x<assistant>abc<assistant>abc"
    assert placed.known == (KnownSpan(len("<user>x<assistant>"), len("<user>x<assistant>abc"), (7, 8)),)
