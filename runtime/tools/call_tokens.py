"""The tokens of a tool-call format that a tokenizer may have as special tokens, kept in the text calls are parsed
from.

Output is decoded without special tokens (the end of turn, chat markers), but some tokenizers add a format's call
syntax as special tokens: Hermes-style `<tool_call>` and `</tool_call>` in some Qwen and Hermes tokenizers, Mistral's
`[TOOL_CALLS]` (v0.3 and later), Command R7B's `<|START_ACTION|>` and `<|END_ACTION|>`. Skipped, a model that writes
them never gets a call parsed under "auto", and the text remembered for its calls (runtime.tools.memory) lacks them,
so the next turn's prompt differs from what the model wrote from that token on. A request that parses calls decodes
its output keeping these (only these).
"""

from __future__ import annotations

from typing import Any

from radixcache.runtime.tools.parse import CLOSE, MISTRAL_CALLS, OPEN
from radixcache.runtime.tools.parse_command_r import COMMAND_R, COMMAND_R7B, END_ACTION, START_ACTION

MARKERS = {
    "hermes": (OPEN, CLOSE),
    "native": (MISTRAL_CALLS,),
    "generic": (),
    COMMAND_R: (),  # `Action:` is text
    COMMAND_R7B: (START_ACTION, END_ACTION),
}


def call_token_ids(tokenizer: Any, fmt: str) -> frozenset[int]:
    """The ids of the tokens `tokenizer` has for format `fmt`'s call syntax (a plain token among them decodes as
    text anyway), or none."""
    to_id = getattr(tokenizer, "token_to_id", None)
    if to_id is None:
        return frozenset()
    return frozenset(i for marker in MARKERS.get(fmt, ()) if (i := to_id(marker)) is not None)


def special_markers(tokenizer: Any, fmt: str) -> frozenset[str]:
    """The markers of format `fmt`'s call syntax that `tokenizer` has as special tokens (R7B's `<|START_ACTION|>`):
    a grammar that writes the syntax offers them as those tokens, which the model was trained to write (the grammar
    engine never matches a special token with text), beside the text."""
    to_id = getattr(tokenizer, "token_to_id", None)
    added = getattr(getattr(tokenizer, "backend", None), "get_added_tokens_decoder", None)
    if to_id is None or added is None or not MARKERS.get(fmt):
        return frozenset()
    special = {i for i, t in added().items() if getattr(t, "special", False)}
    return frozenset(m for m in MARKERS.get(fmt, ()) if to_id(m) in special)
