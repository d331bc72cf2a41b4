"""Mistral 7B Instruct v0.3's chat template renders a plain assistant reply as `" " + content|trim + eos_token`, and
the engine renders a remembered call as that plain reply (the exact text the model wrote, runtime.tools.memory): so
the next prompt read `[/INST] [TOOL_CALLS] [...]` where the model had written `[TOOL_CALLS]` right after `[/INST]`,
and every tool turn missed the cache from its reply on (the model also read a space it never wrote). The space a
template puts between the prompt and a reply's content is left out before a remembered reply
(runtime.tools.known_tokens), so the next prompt extends the last prompt and reply token for token, in the engine and
over HTTP. The tiny checkpoint with `[TOOL_CALLS]` as a special token and a template of v0.3's shape; the model's
output scripted. And a history whose call ids a client made up, of another length than the template's 9, renders."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.engine.sampling import Sampler
from radixcache.runtime.server import create_app
from radixcache.runtime.tools.use import ToolUse
from tests.runtime.structured.conftest import TOOLS, make_engine

PAGE = 4
RAISE = "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
V03 = (  # Mistral-7B-Instruct-v0.3's tool template, its system prompt and content checks left out
    "{{- bos_token }}"
    "{%- set user_messages = messages | selectattr('role', 'equalto', 'user') | list %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if tools is not none and message == user_messages[-1] %}"
    "[AVAILABLE_TOOLS] {{ tools|tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "{{- '[INST] ' + message['content'] + '[/INST]' }}"
    "{%- elif message.tool_calls is defined and message.tool_calls is not none %}"
    "{{- '[TOOL_CALLS] [' }}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- set out = tool_call.function|tojson %}{{- out[:-1] }}"
    "{%- if not tool_call.id is defined or tool_call.id|length != 9 %}" + RAISE + "{%- endif %}"
    "{{- ', \"id\": \"' + tool_call.id + '\"}' }}"
    "{%- if not loop.last %}{{- ', ' }}{%- else %}{{- ']' + eos_token }}{%- endif %}"
    "{%- endfor %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content']|trim + eos_token }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '[TOOL_RESULTS] {\"content\": ' + message.content|string + ', ' }}"
    "{%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}" + RAISE + "{%- endif %}"
    "{{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}"
    "{%- endif %}{%- endfor %}"
)
TOOL_CALLS = 258
ASK = [{"role": "user", "content": "What is 2 + 3?"}]
CALL = '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}}]'
TWO = '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "now", "arguments": {}}]'


@pytest.fixture(scope="module")
def engine(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    directory = tmp_path_factory.mktemp("mistral_v03") / "tiny"
    shutil.copytree(tiny_dir, directory)
    spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    token = {"id": TOOL_CALLS, "content": "[TOOL_CALLS]", "single_word": False, "lstrip": False, "rstrip": False}
    spec["added_tokens"].append({**token, "normalized": False, "special": True})
    (directory / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (directory / "chat_template.jinja").write_text(V03, encoding="utf-8")
    with make_engine(directory, page_size=PAGE) as e:
        yield e
        assert e.check()["locked_blocks"] == 0


@pytest.fixture
def writes(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Makes the model write `text` and its end of turn (the sampler scripted), whatever its weights say."""

    def script(text: str) -> list[int]:
        ids = [*engine.tokenizer.encode(text, add_special_tokens=False), engine.eos_token_ids[0]]
        monkeypatch.setattr(Sampler, "sample", lambda self, logits, prompt, out: ids[len(out)])
        return ids

    return script


def prompt_ids(engine: Engine, messages: list[dict[str, Any]]) -> list[int]:
    return list(engine.tokenizer.encode(engine._builder.render(messages, ToolUse.of(TOOLS, "auto"))))


@pytest.mark.parametrize("output", [CALL, TWO], ids=["one call", "parallel calls"])
def test_the_next_prompt_extends_a_call_the_template_reads_after_a_space(engine: Engine, writes: Any, output) -> None:
    emitted = writes(output)
    first = engine.chat(ASK, 100, tools=TOOLS, temperature=1.0)
    assert first.finish_reason == "tool_calls" and list(first.token_ids) == emitted and emitted[0] == TOOL_CALLS
    reply = {"role": "assistant", "content": None, "tool_calls": [c.to_openai() for c in first.tool_calls]}
    results = [{"role": "tool", "tool_call_id": c.id, "content": "5"} for c in first.tool_calls]
    history = [*ASK, reply, *results]
    before = prompt_ids(engine, ASK) + emitted
    assert prompt_ids(engine, history)[: len(before)] == before  # "[/INST] [TOOL_CALLS]" read before
    writes("It is 5.")
    second = engine.chat(history, 100, tools=TOOLS, temperature=1.0)
    assert second.cached_tokens >= (len(before) - 1) // PAGE * PAGE
    # a plain reply renders as the template writes it (its space too)
    plain = [*history, {"role": "assistant", "content": second.text}, {"role": "user", "content": "Thanks."}]
    assert "[/TOOL_RESULTS] It is 5." in engine._builder.render(plain, ToolUse.of(TOOLS, "auto"))


def test_over_http_the_next_turn_is_served_from_the_cache(engine: Engine, writes: Any) -> None:
    body = {"model": "tiny", "tools": TOOLS, "temperature": 1.0, "max_tokens": 100}
    with TestClient(create_app(engine, "tiny")) as client:
        writes(CALL)
        first = client.post("/v1/chat/completions", json={**body, "messages": ASK}).json()
        (choice,) = first["choices"]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        history = [*ASK, choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": "5"}]
        writes("It is 5.")
        second = client.post("/v1/chat/completions", json={**body, "messages": history}).json()
    usage = first["usage"]
    done = usage["prompt_tokens"] + usage["completion_tokens"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= (done - 1) // PAGE * PAGE, second["usage"]


@pytest.mark.parametrize("call_id", ["call_abc123xyz", "abc", "call_" + "f" * 24])
def test_a_client_made_id_of_another_length_renders(engine: Engine, writes: Any, call_id: str) -> None:
    """A client that made up its calls' ids (`call_abc123xyz`, or another server's `call_` + 24 hex digits) had every
    turn refused by the template ("Tool call IDs should be alphanumeric strings with length 9!": a 400 over HTTP).
    The template is given, for each id of another length, 9 letters and digits drawn from it: the same for the call
    and its result, and at every turn, so the conversation renders and its prompt stays the same."""
    call = {"id": call_id, "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]
    history.append({"role": "tool", "tool_call_id": call_id, "content": "5"})
    text = engine._builder.render(history, ToolUse.of(TOOLS, "auto"))
    (shown,) = re.findall(r'"id": "([^"]*)"', text)
    assert re.fullmatch(r"[A-Za-z0-9]{9}", shown) and f'"call_id": "{shown}"' in text
    assert engine._builder.render(history, ToolUse.of(TOOLS, "auto")) == text
    writes("It is 5.")
    assert engine.chat(history, 100, tools=TOOLS, temperature=1.0).text == "It is 5."
    other = [*history[:1], {**history[1], "tool_calls": [{**call, "id": call_id + "x"}]}]
    other.append({**history[2], "tool_call_id": call_id + "x"})
    assert engine._builder.render(other, ToolUse.of(TOOLS, "auto")) != text  # another id, another call
    with TestClient(create_app(engine, "tiny")) as client:
        r = client.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": history, "tools": TOOLS, "max_tokens": 1}
        )
        assert r.status_code == 200, r.text


def test_a_client_made_id_of_the_demanded_length_is_kept(engine: Engine) -> None:
    call = {"id": "abcdefghi", "type": "function", "function": {"name": "now", "arguments": "{}"}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]
    history.append({"role": "tool", "tool_call_id": "abcdefghi", "content": "12:00"})
    text = engine._builder.render(history, ToolUse.of(TOOLS, "auto"))
    assert '"id": "abcdefghi"' in text and '"call_id": "abcdefghi"' in text
