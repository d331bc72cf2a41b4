"""A history whose call's arguments hold an escaped lone surrogate (`{"city": "\\ud800x"}`: valid JSON a model may
write) rendered by a template that re-dumps the arguments (Hermes' `tojson`), once the runtime's memory of the call
is lost: the prompt keeps the escape as it was written, so the chat, legacy function_call and Responses paths
prompt the ids of that text (and the cache holds them), where the raw surrogate made the tokenizer refuse it. A
template that prints an argument's value itself cannot keep it: that 400 names the call's arguments, not nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as Backend

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from tests.runtime.tools.test_prefix import HERMES
from tests.tiny_tools import TOOLS as TINY_TOOLS

pytestmark = pytest.mark.xdist_group("hermes_surrogate")  # its module-scoped engine, built once
PAGE = 4
WEATHER = {k: v for k, v in TINY_TOOLS[0]["function"].items() if k != "strict"}  # as the server renders it
TOOLS = [{"type": "function", "function": WEATHER}]
ARGS = '{"city": "\\ud800x", "unit": "c"}'  # the six characters \ud800, as the model wrote them
ASK = {"role": "user", "content": "Weather?"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}
HISTORY = [ASK, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "21"}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.cli.conftest import write_tiny_checkpoint

    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("hermes_surrogate") / "tiny")
    (directory / "chat_template.jinja").write_text(HERMES, encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def client(model: Path) -> Iterator[TestClient]:
    engine = Engine(str(model), capacity_blocks=256, page_size=PAGE, dtype="float64", threads=1)
    with TestClient(create_app(engine, "tiny")) as c:
        yield c
    engine.close()


def reference_ids(model: Path) -> list[int]:
    """The template rendered with the arguments as written: the history is ASCII, so a `tojson` that writes ASCII
    (escapes) writes each string as the request spelled it."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = json.dumps
    messages = [*HISTORY[:1], {**HISTORY[1], "content": ""}, RESULT]
    messages[1]["tool_calls"] = [{**CALL, "function": {"name": "get_weather", "arguments": json.loads(ARGS)}}]
    text = env.from_string(HERMES).render(messages=messages, tools=TOOLS, add_generation_prompt=True)
    assert "\\ud800x" in text
    return Backend.from_file(str(model / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def _chat() -> dict[str, Any]:
    return {"messages": [*HISTORY, RESULT], "tools": TOOLS}


def _legacy() -> dict[str, Any]:
    call = {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": ARGS}}
    result = {"role": "function", "name": "get_weather", "content": "21"}
    return {"messages": [ASK, call, result], "functions": [t["function"] for t in TOOLS]}


def _responses() -> dict[str, Any]:
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": ARGS}
    result = {"type": "function_call_output", "call_id": "call_1", "output": "21"}
    return {"input": [ASK, call, result], "tools": [{"type": "function", **t["function"]} for t in TOOLS]}


@pytest.mark.parametrize("body", [_chat, _legacy, _responses], ids=["chat", "legacy", "responses"])
def test_an_escaped_lone_surrogate_in_arguments_is_prompted_as_written(client, model, body) -> None:
    ids = reference_ids(model)
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": ids, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    responses = body is _responses
    path = "/v1/responses" if responses else "/v1/chat/completions"
    limit = {"max_output_tokens": 16} if responses else {"max_tokens": 1}
    r = client.post(path, json={"model": "tiny", "temperature": 0, **limit, **body()})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    if responses:
        assert usage["input_tokens"] == len(ids)
        assert usage["input_tokens_details"]["cached_tokens"] >= (len(ids) - 1) // PAGE * PAGE
    else:
        assert usage["prompt_tokens"] == len(ids)
        assert usage["prompt_tokens_details"]["cached_tokens"] >= (len(ids) - 1) // PAGE * PAGE


RAW_VALUES = (  # a template that prints each argument's value as text (no tojson)
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}"
    "{% for k, v in c.function.arguments.items() %}{{ k }}={{ v }} {% endfor %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if tools %}{% endif %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def raw_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    from tests.cli.conftest import write_tiny_checkpoint

    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("raw_values") / "tiny")
    (directory / "chat_template.jinja").write_text(RAW_VALUES, encoding="utf-8")
    engine = Engine(str(directory), capacity_blocks=256, page_size=PAGE, dtype="float64", threads=1)
    with TestClient(create_app(engine, "tiny")) as c:
        yield c
    engine.close()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_chat, "messages.1.tool_calls.0.function.arguments"),
        (_legacy, "messages.1.tool_calls.0.function.arguments"),  # as the legacy path names other argument errors
        (_responses, "input.1.arguments"),
    ],
    ids=["chat", "legacy", "responses"],
)
def test_a_template_that_prints_the_surrogate_raw_is_a_400_naming_the_arguments(raw_client, body, param) -> None:
    responses = body is _responses
    limit = {"max_output_tokens": 16} if responses else {"max_tokens": 1}
    r = raw_client.post(
        "/v1/responses" if responses else "/v1/chat/completions", json={"model": "tiny", **limit, **body()}
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "surrogate" in error["message"], error
