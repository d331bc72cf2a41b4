"""OpenAI's deprecated function calling, served as tools: `functions` and `function_call` in, `message.function_call`
and finish_reason "function_call" out, and histories with assistant `function_call` and `role: "function"` turns.

- Request: `functions` are tools of type function; `function_call` "none" / "auto" / `{"name": N}` is tool_choice
  none / auto / named; parallel calls are off (one call at most, as the legacy API returns one). Mixing them with
  `tools`, `tool_choice` or `parallel_tool_calls` is a 400 naming the legacy field. Errors name the legacy path
  (`functions.0.parameters.properties.x.type`, `function_call.name`, a history's `messages.1.function_call`).
- History: an assistant `function_call` becomes a tool call, a `function` message (which must carry `name`) the tool
  turn answering the latest call of that name. A legacy call has no id: the server remembers the engine's id of each
  call it answered by the conversation before it, its name and its arguments (`LegacyCalls`), so a replayed call
  renders as the exact text the model wrote and the next turn hits the cache, even when the conversation made the
  same call before (an agent polling a function: each turn keeps its own id, which the tool result's line shows);
  a history replayed in another form (say, content "" for null) falls back to the latest id of that name and those
  arguments; a call it does not know gets an id from its message's position, the same every turn, so the prompt's
  prefix stays stable (of the length a template demands of ids: Mistral's 9 letters and digits). All of it per
  cache namespace (API key and salt): a call one tenant made never lends its id to another's history (the id is in
  the prompt, whose length would tell that the call was made).
- Reply: the first call as `function_call` {name, arguments} (no `tool_calls`), finish_reason "function_call";
  streamed as `{"function_call": {"name": N, "arguments": ""}}` then `{"function_call": {"arguments": piece}}`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from radixcache.runtime.server.protocol import APIError
from radixcache.runtime.tools.fair_lru import FairLRU, fair_scope
from radixcache.runtime.tools.messages import call_arguments, canonical_arguments
from radixcache.runtime.tools.use import alphanumeric_id

MAX_REMEMBERED = 4096  # legacy calls whose ids the server keeps (the oldest are forgotten first)
MAX_REMEMBERED_BYTES = 16 << 20  # and the characters of their keys (arguments may be a whole context of text)
FINISH = {"tool_calls": "function_call"}


class LegacyCalls:
    """The engine's ids of the calls answered as `function_call`, by (scope, context, name, arguments), where the
    scope is the caller's cache namespace, the context the digest of the conversation the call answered (`contexts`)
    and "" stands for any (the latest such call of the scope), least recently remembered or replayed first.

    Bounded on all scopes together (`size` calls, and `max_bytes` characters of keys: a call's arguments may be a
    whole context: 4,096 of them could hold gigabytes; a call weighing more than an eighth of it is not kept, as it
    would flush every scope's calls), shared by the scopes' tenants; past it the tenant holding the most
    loses its least recently used (runtime/tools/fair_lru.py), so one tenant's legacy calls (under any salts) never
    evict another's while that one holds no more than its share (its next turn would have fallen back to positional
    ids: another prompt, a cache miss)."""

    def __init__(self, size: int = MAX_REMEMBERED, max_bytes: int = MAX_REMEMBERED_BYTES) -> None:
        self.size = size
        self.max_bytes = max_bytes
        # two keys per call, each (scope, context, name, arguments), shared by the scope's tenant
        self._ids: FairLRU[tuple[Hashable, str, str, str], str] = FairLRU(2 * size, max_bytes)

    def remember(self, calls: Sequence[Any], context: str = "", scope: Hashable = None) -> None:
        for call in calls[:1]:  # the reply shows its first call only
            arguments = canonical_arguments(call.arguments)
            weight = len(context) + len(call.name) + len(arguments) + len(call.id) + 200  # 200: the tuple, the entry
            if 2 * weight > self.max_bytes // 8:
                continue
            for key in ((context, call.name, arguments), ("", call.name, arguments)):
                self._ids.put(fair_scope(scope), (scope, *key), call.id, weight)

    def id_for(self, name: str, arguments: str, context: str = "", scope: Hashable = None) -> str | None:
        """The id remembered for this call (refreshed: a call an agent replays every turn is in use, and evicting it
        would change that agent's prompt from it on), or None. Arguments are compared as the tool-call memory
        compares them (as JSON values; "" as `{}`, which the history reads for a call cut after its name)."""
        arguments = canonical_arguments(arguments)
        tenant = fair_scope(scope)
        found = self._ids.get(tenant, (scope, context, name, arguments))
        return found or self._ids.get(tenant, (scope, "", name, arguments))

    def reply_to(self, messages: Sequence[dict[str, Any]], scope: Hashable = None) -> LegacyReply:
        """Where the calls of a reply to `messages` in namespace `scope` are remembered."""
        *_, context = contexts(messages)
        return LegacyReply(self, context, scope)


@dataclass(frozen=True, slots=True)
class LegacyReply:
    """The calls of one request's replies, remembered under the conversation they answer and its namespace."""

    calls: LegacyCalls
    context: str
    scope: Hashable = None

    def remember(self, calls: Sequence[Any]) -> None:
        self.calls.remember(calls, self.context, self.scope)


def contexts(messages: Sequence[dict[str, Any]]) -> Iterator[str]:
    """The digest of each prefix of `messages` (as the request's messages read, before the legacy turns become tool
    turns): before the first message, ..., after the last. A later turn replays the same messages, so the digest
    before its message i is the one of the request that message i answered."""
    digest = hashlib.sha256()
    yield digest.hexdigest()
    for m in messages:
        digest.update(json.dumps(m, sort_keys=True).encode() + b"\x00")
        yield digest.hexdigest()


def is_legacy(body: Any) -> bool:
    return getattr(body, "functions", None) is not None or getattr(body, "function_call", None) is not None


def check_not_mixed(body: Any) -> None:
    """The legacy fields and the tool fields are two ways to say the same thing: one request uses one."""
    if not is_legacy(body):
        return
    legacy = "functions" if body.functions is not None else "function_call"
    mixed = [f for f in ("tools", "tool_choice", "parallel_tool_calls") if getattr(body, f) is not None]
    if mixed:
        raise APIError(
            400, f"{legacy} (OpenAI's deprecated form) and {mixed[0]} cannot be given together: send one", param=legacy
        )


def tool_fields(body: Any) -> tuple[Any, Any, bool | None]:
    """(tools, tool_choice, parallel_tool_calls) of a legacy body, in the tool fields' form."""
    functions = body.functions
    tools = None if functions is None else [{"type": "function", "function": f} for f in functions]
    choice = body.function_call
    if isinstance(choice, dict):
        if not isinstance(choice.get("name"), str):  # the tool path's 400 would ask for its own shape, `function`
            got = choice.get("name")
            raise APIError(
                400, f'function_call.name: a named choice is {{"name": ...}}, got {got!r}', param="function_call.name"
            )
        choice = {"type": "function", "function": choice}
    return tools, choice, (False if tools else None)


_TOOL = re.compile(r"^tools\[(\d+)\](\.function)?")


def legacy_path(path: str) -> str:
    """A tool field's path in the legacy names: `tools[2].function.name` -> `functions[2].name`."""
    path = _TOOL.sub(r"functions[\1]", path)
    if path.startswith("tool_choice"):
        path = "function_call" + path[len("tool_choice") :].replace(".function", "", 1)
    return path


def legacy_messages(
    messages: list[dict[str, Any]], calls: LegacyCalls, scope: Hashable = None, id_length: int | None = None
) -> list[dict[str, Any]]:
    """A history with legacy turns as a history with tool turns (see the module docstring); `scope`: the caller's
    cache namespace, whose calls alone lend their ids; `id_length`: the length the template demands of call ids
    (TemplateFeatures.call_id_length, Mistral's 9), which the positional ids of calls none lends then have too."""
    out: list[dict[str, Any]] = []
    latest: dict[str, str] = {}  # name -> the id of its latest call
    last_id: str | None = None
    prefixes = contexts(messages)
    for i, m in enumerate(messages):
        context = next(prefixes)  # the conversation before message i
        m = dict(m)
        call = m.pop("function_call", None)
        if call is not None:
            if m.get("role") != "assistant":
                raise APIError(400, "only assistant messages carry function_call", param=f"messages.{i}.function_call")
            if m.get("tool_calls"):
                raise APIError(400, "give function_call or tool_calls, not both", param=f"messages.{i}.function_call")
            name, arguments = call.get("name"), call.get("arguments")
            if not isinstance(name, str) or not isinstance(arguments, (str, type(None))):
                raise APIError(
                    400, "function_call is {'name': str, 'arguments': JSON text}", param=f"messages.{i}.function_call"
                )
            arguments = call_arguments(arguments, f"messages[{i}].function_call.arguments")  # text as written; "{}"
            call_id = calls.id_for(name, arguments, context, scope) or _positional_id(i, id_length)
            m["tool_calls"] = [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]
            latest[name], last_id = call_id, call_id
        if m.get("role") == "function":
            name = m.get("name")
            if not isinstance(name, str) or not name:
                raise APIError(400, "a function message needs the name of the function", param=f"messages.{i}.name")
            m["role"] = "tool"
            m["tool_call_id"] = latest.get(name) or last_id or _positional_id(i, id_length)
        out.append(m)
    return out


def _positional_id(i: int, id_length: int | None) -> str:
    """The id of message i's call when no remembered call lends one: the same at every turn (the same prompt), and
    of `id_length` letters and digits where the template demands it (call_fn000001 was a ChatTemplateError there)."""
    return f"call_fn{i:06d}" if id_length is None else alphanumeric_id(f"fn{i}", id_length)


def message(text: str, calls: Sequence[Any]) -> dict[str, Any]:
    """The legacy assistant message: its first call as `function_call`."""
    first = calls[0]
    return {
        "role": "assistant",
        "content": text or None,
        "function_call": {"name": first.name, "arguments": first.arguments},
    }


def delta(d: dict[str, Any]) -> dict[str, Any] | None:
    """A tool-call delta in the legacy shape (None for a call after the first: the legacy reply has one)."""
    if "tool_calls" not in d:
        return d
    (tc,) = d["tool_calls"]
    if tc["index"] != 0:
        return None
    fn = tc["function"]
    return {"function_call": {"name": fn["name"], "arguments": fn["arguments"]} if "name" in fn else fn}
