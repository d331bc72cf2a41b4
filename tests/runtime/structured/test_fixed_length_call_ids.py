"""Mistral's tool templates (7B Instruct v0.3, Small, Nemo) raise "Tool call IDs should be alphanumeric strings with
length 9!" for an assistant call's `id` or a tool turn's `tool_call_id` of another length, and our ids were `call_`
and 24 hex digits: every tool round trip on such a model was a ChatTemplateError (a 400 over HTTP). The template's
check is read once (TemplateFeatures.call_id_length), and the calls of its requests get ids it accepts: 9 letters and
digits, the same in the stream, the result and over HTTP, so the client's replay renders (and hits the cache)."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.tools import assemble, template_features
from radixcache.runtime.tools.use import CallIds
from tests.runtime.structured.conftest import PAGE, TOOLS, make_engine

RAISE = "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
# the checks of Mistral-7B-Instruct-v0.3's template, in a template of its shape
MISTRAL = (
    "{%- if tools %}[AVAILABLE_TOOLS] {{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}[INST] {{ m.content }}[/INST]"
    "{%- elif m.tool_calls is defined and m.tool_calls %}[TOOL_CALLS] ["
    "{%- for c in m.tool_calls %}{{ c.function|tojson }}"
    "{%- if not c.id is defined or c.id|length != 9 %}" + RAISE + "{% endif %}"
    "{%- endfor %}]</s>"
    "{%- elif m.role == 'assistant' %}{{ m.content }}</s>"
    "{%- elif m.role == 'tool' %}"
    "{%- if not m.tool_call_id is defined or m.tool_call_id|length != 9 %}" + RAISE + "{% endif %}"
    '[TOOL_RESULTS] {"content": {{ m.content|tojson }}, "call_id": "{{ m.tool_call_id }}"}[/TOOL_RESULTS]'
    "{%- endif %}{%- endfor %}"
)
NAMED = {"type": "function", "function": {"name": "add"}}
ASK = [{"role": "user", "content": "What is 2 + 3?"}]
NINE = re.compile(r"[A-Za-z0-9]{9}")


@pytest.fixture(scope="module")
def engine(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    directory = tmp_path_factory.mktemp("mistral") / "tiny"
    shutil.copytree(tiny_dir, directory)
    (directory / "chat_template.jinja").write_text(MISTRAL, encoding="utf-8")
    with make_engine(directory) as e:
        yield e
        assert e.check()["locked_blocks"] == 0


def test_the_length_a_template_demands_is_read_from_its_source(tiny_dir: Path) -> None:
    assert template_features(MISTRAL).call_id_length == 9
    subscript = "{% for m in messages %}{% if m['tool_call_id']|length == 12 %}x{% endif %}{% endfor %}"
    assert template_features(subscript).call_id_length == 12
    plain = "{% for m in messages %}{{ m.content|length }}{% if m.content|length > 3 %}!{% endif %}{% endfor %}"
    assert template_features(plain).call_id_length is None
    ids = CallIds(length=9)
    first, again = ids.sequence(), ids.sequence()
    drawn = [first() for _ in range(50)]
    assert all(NINE.fullmatch(i) for i in drawn) and len(set(drawn)) == 50
    assert drawn[:3] == [again() for _ in range(3)]  # every parser of a request names the same calls
    assert CallIds().sequence()().startswith("call_")


def _round_trip(engine: Engine, reply: dict[str, Any], call_id: str) -> list[dict[str, Any]]:
    return [*ASK, reply, {"role": "tool", "tool_call_id": call_id, "content": "5"}]


def test_a_tool_round_trip_renders_with_the_ids_the_engine_gave(engine: Engine) -> None:
    first = engine.chat(ASK, 80, tools=TOOLS, tool_choice=NAMED)
    (call,) = first.tool_calls
    assert NINE.fullmatch(call.id), call.id

    async def deltas() -> list[dict[str, Any]]:
        return [d async for d in engine.stream(ASK, 80, tools=TOOLS, tool_choice=NAMED)]

    _, streamed = assemble(asyncio.run(deltas()))
    assert [bool(NINE.fullmatch(c["id"])) for c in streamed] == [True]
    reply = {"role": "assistant", "content": None, "tool_calls": [call.to_openai()]}
    second = engine.chat(_round_trip(engine, reply, call.id), 1, tools=TOOLS)  # raised ChatTemplateError
    assert second.cached_tokens >= (first.prompt_tokens + len(first.token_ids) - 1) // PAGE * PAGE


def test_a_tool_round_trip_over_http(engine: Engine) -> None:
    body = {"model": "tiny", "tools": TOOLS, "max_tokens": 40}
    with TestClient(create_app(engine, "tiny")) as client:
        first = client.post("/v1/chat/completions", json={**body, "messages": ASK, "tool_choice": NAMED}).json()
        message = first["choices"][0]["message"]
        call_id = message["tool_calls"][0]["id"]
        assert NINE.fullmatch(call_id), call_id
        again = {**body, "messages": _round_trip(engine, message, call_id), "max_tokens": 1}
        second = client.post("/v1/chat/completions", json=again)
        assert second.status_code == 200, second.text


def test_a_legacy_function_call_the_server_never_made_renders_with_a_fixed_length_id(engine: Engine) -> None:
    """A legacy history's function_call that no remembered call names (another server's, or one forgotten) was given
    the positional id call_fn000001, which the template refused: 400 on every such turn (Mistral, `functions`)."""
    functions = [t["function"] for t in TOOLS]
    call = {"name": functions[0]["name"], "arguments": '{"a": 2, "b": 3}'}
    history = [*ASK, {"role": "assistant", "content": None, "function_call": call}]
    history.append({"role": "function", "name": call["name"], "content": "5"})
    body = {"model": "tiny", "functions": functions, "max_tokens": 1}
    with TestClient(create_app(engine, "tiny")) as client:
        first = client.post("/v1/chat/completions", json={**body, "messages": history})
        assert first.status_code == 200, first.text
        again = client.post("/v1/chat/completions", json={**body, "messages": history})
        assert again.status_code == 200, again.text
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the same ids: the same prompt
