"""A model with a "default" and a "tool_use" chat template (tokenizer_config.json's list, as Hermes 2 Pro and
Command-R ship) behind /v1/chat/completions and /v1/responses, in process: a chat with tools is prompted with the
tool_use template (its prompt is the reference ids of that template, which the cache then holds), one without with
the default, and the calls are written and parsed in the tool_use template's format (`<tool_call>` tags)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from tests.runtime.loading.test_named_templates import DEFAULT, MESSAGES, TEMPLATES, TOOL_USE, TOOLS, reference_ids

pytestmark = pytest.mark.xdist_group("tool_use_template")  # its module-scoped engine, built once
PAGE = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.cli.conftest import write_tiny_checkpoint

    tiny = write_tiny_checkpoint(tmp_path_factory.mktemp("tool_use") / "tiny")
    directory = shutil.copytree(tiny, tiny.parent / "two")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATES}))
    return directory


@pytest.fixture(scope="module")
def app(model: Path) -> Iterator[tuple[TestClient, Engine]]:
    engine = Engine(str(model), capacity_blocks=256, page_size=PAGE, dtype="float64", threads=1)
    with TestClient(create_app(engine, "tiny")) as client:
        yield client, engine
    engine.close()


def _chat(client: TestClient, **kw: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 1, "temperature": 0, **kw}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _cached_after(client: TestClient, ids: list[int], **kw: Any) -> dict[str, Any]:
    """The chat's usage after a completion of `ids` alone put those ids in the cache."""
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": ids, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    return _chat(client, **kw)["usage"]


def test_a_chat_with_tools_is_prompted_with_the_tool_use_template(app, model) -> None:
    client, engine = app
    ids = reference_ids(model, TOOL_USE, TOOLS)
    usage = _cached_after(client, ids, tools=TOOLS)
    assert usage["prompt_tokens"] == len(ids)
    assert usage["prompt_tokens_details"]["cached_tokens"] >= (len(ids) - 1) // PAGE * PAGE  # the same ids
    plain = reference_ids(model, DEFAULT, None)
    usage = _cached_after(client, plain)
    assert usage["prompt_tokens"] == len(plain)
    assert usage["prompt_tokens_details"]["cached_tokens"] >= (len(plain) - 1) // PAGE * PAGE
    assert engine._builder.tool_features.format == engine.output.tool_features.format == "hermes"


def test_required_calls_are_tool_call_tags(app) -> None:
    """The grammar of a required call is the tool_use template's (tags, which the logprobs' tokens show), and so
    is the parser: the reply's calls are the tags' calls, with no text around them."""
    client, _ = app
    r = _chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=120, logprobs=True)
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None, choice
    written = "".join(t["token"] for t in choice["logprobs"]["content"])
    assert written.startswith("<tool_call>") and written.rstrip().endswith("</tool_call>"), written
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] in {"add", "now"} and isinstance(json.loads(call["function"]["arguments"]), dict)


def test_the_responses_api_with_tools_is_prompted_with_the_tool_use_template(app, model) -> None:
    client, _ = app
    ids = reference_ids(model, TOOL_USE, TOOLS)
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    body = {"model": "tiny", "input": MESSAGES, "tools": tools, "max_output_tokens": 16, "temperature": 0}
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] == len(ids)
