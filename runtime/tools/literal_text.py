"""Tool results stay text: a result that spells a special token (`<|im_end|>`, `<|im_start|>system`, a call tag the
tokenizer has as one token) must reach the model as those characters, never as the control token, or any web page or
file a tool returns could end the tool turn and open a system or assistant turn of its own (prompt injection).

The template renders the history, and the tokenizer would read every special token's text in the rendered prompt as
that token, the template's own and a result's alike. So each such text in a tool message's content is replaced by a
mark before rendering (letters and digits only, which a template's filters, `tojson` and `trim` among them, print
unchanged), and after it each mark becomes its text again, as a span whose ids are that text encoded as plain text
(`runtime/tools/known_tokens.py` splices them in, as it does the ids the model emitted). A template that does not print
each mark as it was given (one that changes a result's text) is rendered without marks: the prompt is then the one it
always was. Only tool results are treated so: user and system text is the caller's own, and an assistant's replayed
calls may be written in their format's special tokens on purpose.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Callable, Collection, Sequence

from radixcache.runtime.tools.known_tokens import KnownSpan, PromptText
from radixcache.runtime.tools.messages import ChatMessage


@dataclasses.dataclass(frozen=True)
class LiteralMarks:
    """The marks put into a history's tool results: mark `k` (`<base>n<k>q`) stands for `texts[k]`."""

    base: str
    texts: tuple[str, ...]

    def mark(self, k: int) -> str:
        return f"{self.base}n{k}q"

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(re.escape(self.base) + r"n(\d+)q")


def special_pattern(specials: Collection[str]) -> re.Pattern[str] | None:
    """A pattern of the special tokens' texts, the longest first where one begins another (as the tokenizer matches
    them); None for none."""
    texts = sorted((t for t in specials if t), key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in texts)) if texts else None


def mark_tool_results(
    messages: Sequence[ChatMessage], pattern: re.Pattern[str] | None
) -> tuple[Sequence[ChatMessage], LiteralMarks | None]:
    """`messages` with each special token's text in a tool message's content replaced by a mark, and the marks; the
    messages themselves and None when no result spells one."""
    if pattern is None or not any(m.role == "tool" and m.content and pattern.search(m.content) for m in messages):
        return messages, None
    marks = LiteralMarks(f"q{uuid.uuid4().hex}", ())
    texts: list[str] = []

    def marked(found: re.Match[str]) -> str:
        texts.append(found.group(0))
        return marks.mark(len(texts) - 1)

    out = [
        dataclasses.replace(m, content=pattern.sub(marked, m.content)) if m.role == "tool" and m.content else m
        for m in messages
    ]
    return out, dataclasses.replace(marks, texts=tuple(texts))


def unmark(text: str, marks: LiteralMarks, literal_ids: Callable[[str], Sequence[int]]) -> PromptText | None:
    """`text` (rendered from marked messages; a PromptText's known spans kept, moved) with each mark replaced by its
    text, as a span of `literal_ids(text)`; None when a mark is missing, or lies in a known span (the template did
    not print each result as given)."""
    known = text.known if isinstance(text, PromptText) else ()
    out: list[str] = []
    spans: list[KnownSpan] = []
    seen: set[int] = set()
    pos = shift = j = 0
    for found in marks.pattern.finditer(text):
        k = int(found.group(1))
        if k >= len(marks.texts):
            return None
        while j < len(known) and known[j].end <= found.start():
            spans.append(KnownSpan(known[j].start + shift, known[j].end + shift, known[j].token_ids))
            j += 1
        if j < len(known) and known[j].start < found.end():  # a mark inside a reply's emitted text
            return None
        literal = marks.texts[k]
        out += [text[pos : found.start()], literal]
        start = found.start() + shift
        spans.append(KnownSpan(start, start + len(literal), tuple(literal_ids(literal)), literal=True))
        shift += len(literal) - len(found.group(0))
        pos = found.end()
        seen.add(k)
    if len(seen) != len(marks.texts):
        return None
    spans += [KnownSpan(s.start + shift, s.end + shift, s.token_ids) for s in known[j:]]
    out.append(text[pos:])
    return PromptText("".join(out), spans)
