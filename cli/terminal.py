"""Text from a model or a trace, as a terminal may show it (`chat`'s replies, `replay -v`'s lines)."""

from __future__ import annotations

# Control characters (C0, DEL, C1) but newline and tab, each shown as its escape: ESC starts the sequences that
# write the clipboard (OSC 52), set the title or move the cursor; CR overwrites a line; C1's CSI is ESC [.
_CONTROLS = {c: ascii(chr(c))[1:-1] for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\n\t"}


def terminal_text(text: str) -> str:
    """`text` as a terminal may show it: a model's reply (or a tool result it echoes), a trace's conversation id, is
    not trusted to drive the terminal, so each control character but newline and tab is written as its Python escape
    (ESC as \\x1b); every other character, unicode included, is kept."""
    return text.translate(_CONTROLS)
