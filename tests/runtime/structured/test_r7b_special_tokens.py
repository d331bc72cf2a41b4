"""Command R7B as its tokenizer has it: `<|START_ACTION|>` and `<|END_ACTION|>` are special tokens (added here to
the tiny tokenizer, whose vocabulary has room for two, with the R7B-style template of tests/command_r_templates.py).
A reply the model writes as its plan, then its action (the sampler scripted), is the plan as content and the call, in
the Python API, its stream and the server, whole and streamed: the action markers are kept in the text calls are
read from (the end of turn, another special token, is still not shown)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.engine.sampling import Sampler
from radixcache.runtime.server import create_app
from radixcache.runtime.tools import assemble
from radixcache.runtime.tools.call_tokens import call_token_ids
from tests.command_r_templates import COMMAND_R7B
from tests.runtime.structured.conftest import TOOLS, make_engine

ASK = [{"role": "user", "content": "What is 2 + 3?"}]
SPECIAL = {258: "<|START_ACTION|>", 259: "<|END_ACTION|>"}
REPLY = (
    'I will add.<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "add", "parameters": {"a": 2, "b": 3}}]'
    "<|END_ACTION|>"
)


@pytest.fixture(scope="module")
def engine(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    directory = tmp_path_factory.mktemp("r7b_special") / "tiny"
    shutil.copytree(tiny_dir, directory)
    spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    for i, text in SPECIAL.items():
        token = {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False}
        spec["added_tokens"].append({**token, "normalized": False, "special": True})
    (directory / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (directory / "chat_template.jinja").write_text(COMMAND_R7B, encoding="utf-8")
    with make_engine(directory) as e:
        assert e._builder.tool_features.format == "command_r7b"
        yield e
        assert e.check()["locked_blocks"] == 0


@pytest.fixture
def writes(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Makes the model write `text` and its end of turn (the sampler scripted), whatever its weights say."""

    def script(text: str) -> list[int]:
        ids = [*engine.tokenizer.encode(text, add_special_tokens=False), engine.eos_token_ids[0]]
        assert set(SPECIAL) <= set(ids)  # each marker is one special token
        monkeypatch.setattr(Sampler, "sample", lambda self, logits, prompt, out: ids[len(out)])
        return ids

    return script


def _calls(calls: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_the_action_markers_are_kept_in_the_text_calls_are_read_from(engine: Engine, writes: Any) -> None:
    assert call_token_ids(engine.tokenizer, "command_r7b") == {258, 259}
    writes(REPLY)
    r = engine.chat(ASK, 100, tools=TOOLS, temperature=1.0)
    assert (r.text, r.finish_reason) == ("I will add.", "tool_calls")
    assert _calls([c.to_openai() for c in r.tool_calls]) == [("add", {"a": 2, "b": 3})]

    async def deltas() -> list[dict[str, Any]]:
        return [d async for d in engine.stream(ASK, 100, tools=TOOLS, temperature=1.0)]

    content, calls = assemble(asyncio.run(deltas()))
    assert content == "I will add." and _calls(calls) == [("add", {"a": 2, "b": 3})]


def test_the_server_parses_it_whole_and_streamed(engine: Engine, writes: Any) -> None:
    writes(REPLY)
    body = {"model": "tiny", "messages": ASK, "tools": TOOLS, "temperature": 1.0, "max_tokens": 100}
    with TestClient(create_app(engine, "tiny")) as client:
        (choice,) = client.post("/v1/chat/completions", json=body).json()["choices"]
        assert choice["message"]["content"] == "I will add." and choice["finish_reason"] == "tool_calls"
        assert _calls(choice["message"]["tool_calls"]) == [("add", {"a": 2, "b": 3})]
        chunks = []
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
    content, calls = assemble(c["choices"][0]["delta"] for c in chunks if c["choices"])
    assert content == "I will add." and _calls(calls) == [("add", {"a": 2, "b": 3})]


def test_a_forced_call_may_write_the_action_markers_as_the_special_tokens(engine: Engine) -> None:
    """Under "required" the grammar wrote R7B's markers as text only (the grammar engine never matches a special
    token with text), never the tokens the model was trained to write. Now it may write either: a model leaning to
    the special token writes it, and the call is read."""
    assert engine._builder.call_markers == {"<|START_ACTION|>", "<|END_ACTION|>"}
    for lean in (100, -100):
        bias = {258: lean, 259: lean}
        r = engine.chat(ASK, 200, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, logit_bias=bias)
        assert r.finish_reason == "tool_calls" and len(r.tool_calls) == 1, r
        written = engine.tool_memory.lookup(r.tool_calls)
        assert written is not None and written.startswith("<|START_ACTION|>") and written.endswith("<|END_ACTION|>")
        assert (r.token_ids[0] == 258) == (lean > 0)  # the special token where leaned to, else the text
