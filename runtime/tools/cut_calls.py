"""`cut_call`: the call in JSON that the output ended inside, in the shapes `parse.loose_calls` reads whole only
(Mistral's list after `[TOOL_CALLS]`, Llama 3's bare `{"name": ..., "parameters": {...}}`, a Hermes tag's JSON in
that shape). The length limit cuts these as it cuts any call: OpenAI returns the call, its arguments as written so
far (no JSON then) at finish_reason "length", so the parser does too rather than make the text content."""

from __future__ import annotations

from radixcache.runtime.tools import scan

MISTRAL_CALLS = "[TOOL_CALLS]"  # Mistral's token before its list of calls (kept: runtime.tools.call_tokens)


def cut_call(text: str, names: set[str]) -> tuple[str, str] | None:
    """(name, arguments as written, perhaps "") of a known tool's call that `text` opens (after `[TOOL_CALLS]` and a
    list's `[` where written) and that ends before its arguments close; None for anything else, arguments that
    closed included (whole JSON is `loose_calls`'s to read)."""
    body = text.lstrip()
    if body.startswith(MISTRAL_CALLS):
        body = body[len(MISTRAL_CALLS) :]
    p = scan.skip_ws(body, 0)
    p += body.startswith("[", p)
    status, p = scan.literals(body, p, ["{", '"name"', ":"])
    if status != "ok":
        return None
    status, p, name = scan.string(body, p)
    if status != "ok" or name not in names:
        return None
    for key in ('"arguments"', '"parameters"'):
        status, q = scan.literals(body, p, [",", key, ":"])
        if status != "no":
            break
    if status == "more":
        return name, ""  # cut after the name, before its arguments open
    q = scan.skip_ws(body, q)
    if status == "no" or (q < len(body) and body[q] != "{"):
        return None
    if q == len(body):
        return name, ""
    _, closed = scan.ValueScanner().feed(body, q)
    return None if closed else (name, body[q:])
