"""Legacy function calls (`functions`, `function_call`) under API keys: the ids the server remembers for the calls
it answered are the caller's namespace's only. A legacy call carries no id, so a replayed one takes the id the
server gave it, found by name and arguments; shared between keys, another tenant's call lent its id to a history
that names the same call, and the id (in the tool result's line) changed the length of that prompt: a tenant read
from `usage.prompt_tokens` which calls another tenant's conversations had made."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import openai
import pytest

from radixcache.runtime.server.legacy import LegacyCalls, legacy_messages
from radixcache.runtime.tools import ToolCall
from tests.server.conftest import Server
from tests.tiny_tools import TOOLS

ADD = next(t["function"] for t in TOOLS if t["function"]["name"] == "add")


def _history(arguments: str) -> list[dict[str, Any]]:
    call = {"name": "add", "arguments": arguments}
    return [
        {"role": "user", "content": "Add something."},
        {"role": "assistant", "content": None, "function_call": call},
        {"role": "function", "name": "add", "content": "5"},
    ]


@pytest.mark.xdist_group("keyed_server")  # the shared server (conftest.py)
def test_another_keys_call_never_changes_a_replayed_history(keyed_server: Server) -> None:
    alice = openai.OpenAI(base_url=keyed_server.v1, api_key="sk-alice", max_retries=0, timeout=60)
    bob = openai.OpenAI(base_url=keyed_server.v1, api_key="sk-bob", max_retries=0, timeout=60)
    asked = [{"role": "user", "content": "What is 2 + 3?"}]
    r = alice.chat.completions.create(
        model="tiny", messages=asked, functions=[ADD], function_call={"name": "add"}, max_tokens=80, temperature=0
    )
    made = r.choices[0].message.function_call.arguments
    # the same call with its first digit changed: as long, as the model spaced it, and made by nobody
    at = next(i for i, ch in enumerate(made) if ch.isdigit())
    other = made[:at] + str((int(made[at]) + 1) % 10) + made[at + 1 :]
    assert json.loads(other).keys() == json.loads(made).keys() and other != made

    def prompt_tokens(arguments: str) -> int:
        reply = bob.chat.completions.create(model="tiny", messages=_history(arguments), functions=[ADD], max_tokens=1)
        return reply.usage.prompt_tokens

    # Bob made neither call: each gets the id of its message's position, so the two prompts are as long
    assert prompt_tokens(made) == prompt_tokens(other)


def test_a_remembered_id_is_found_in_its_namespace_only() -> None:
    calls = LegacyCalls()
    arguments = '{"a": 1, "b": 2}'
    calls.reply_to(_history(arguments)[:1], "ns:alice").remember([ToolCall("call_alice", "add", arguments)])
    ids = {}
    for scope in ("ns:alice", "ns:bob", None):
        (_, assistant, result) = legacy_messages(_history(arguments), calls, scope)
        ids[scope] = (assistant["tool_calls"][0]["id"], result["tool_call_id"])
    assert ids == {
        "ns:alice": ("call_alice", "call_alice"),
        "ns:bob": ("call_fn000001", "call_fn000001"),
        None: ("call_fn000001", "call_fn000001"),
    }


def test_one_tenants_legacy_calls_never_evict_anothers_within_its_share() -> None:
    """The ids were one LRU for every namespace: a busy tenant's calls evicted a quiet tenant's, whose next turn then
    fell back to positional ids (another prompt, a cache miss). Past the bound, the fullest scope loses its oldest."""
    calls = LegacyCalls(size=4)
    calls.remember([ToolCall("call_a", "add", '{"a": 1}')], "ctx", scope="A")
    for i in range(10):
        calls.remember([ToolCall(f"call_b{i}", "add", f'{{"a": {i + 2}}}')], "ctx", scope="B")
    assert calls.id_for("add", '{"a": 1}', "ctx", scope="A") == "call_a"
    kept = [i for i in range(10) if calls.id_for("add", f'{{"a": {i + 2}}}', "ctx", scope="B") is not None]
    assert kept == [7, 8, 9]  # B's newest, in what is left of the bound: 4 calls, A's one among them


def test_a_call_replayed_every_turn_outlives_newer_calls_nobody_replays() -> None:
    """The ids were kept least recently *remembered* first: an agent's first call, replayed at every turn of its
    conversation, was the first to go once the tenant's other conversations made more calls than the bound, and
    that agent's next prompt then rendered it with a positional id (a cache miss from its first call on). A replay
    refreshes the ids it finds, as the tool-call memory refreshes its entries."""
    calls = LegacyCalls(size=4)
    arguments = '{"a": 1, "b": 2}'
    calls.reply_to(_history(arguments)[:1], "ns").remember([ToolCall("call_first", "add", arguments)])
    for i in range(10):  # other conversations' calls, each made once and never replayed
        calls.remember([ToolCall(f"call_other{i}", "add", f'{{"a": {i + 3}}}')], f"ctx{i}", scope="ns")
        (_, assistant, result) = legacy_messages(_history(arguments), calls, "ns")  # the agent's next turn
        assert (assistant["tool_calls"][0]["id"], result["tool_call_id"]) == ("call_first", "call_first"), i


def test_the_remembered_ids_are_bounded_in_bytes_too() -> None:
    """The ids were bounded by count alone, and each key holds the call's arguments, which may be a whole context:
    4,096 long calls held gigabytes. Past about 16 MiB (docs/server.md) the tenant holding the most loses its oldest;
    a call heavier than an eighth of the bound is not kept (it would flush every tenant's)."""
    calls = LegacyCalls()
    calls.remember([ToolCall("call_quiet", "add", '{"a": 1}')], "ctx", scope="quiet")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1200):
            text = f"{i:05d}" * 4000  # 20,000 characters of its own
            calls.remember([ToolCall(f"call_{i}", "echo", json.dumps({"text": text}))], f"ctx{i}", scope="busy")
        taken = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert taken <= 17 << 20, taken  # 1,200 calls of 20,000 characters: 24 MB unbounded
    assert calls.id_for("add", '{"a": 1}', "ctx", scope="quiet") == "call_quiet"
    last = json.dumps({"text": "01199" * 4000})
    assert calls.id_for("echo", last, "ctx1199", scope="busy") == "call_1199"
    huge = json.dumps({"text": "x" * (3 << 20)})  # past an eighth of the bound: not kept, nothing evicted for it
    calls.remember([ToolCall("call_huge", "echo", huge)], "ctx", scope="busy")
    assert calls.id_for("echo", huge, "ctx", scope="busy") is None
    assert calls.id_for("echo", last, "ctx1199", scope="busy") == "call_1199"
