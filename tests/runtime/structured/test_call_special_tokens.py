"""A tokenizer that has a tool-call format's syntax as special tokens (Hermes-style `<tool_call>` and `</tool_call>`
added as special in some Qwen and Hermes tokenizers; Mistral's `[TOOL_CALLS]`): output was decoded without special
tokens, so a model that wrote them never had a call parsed under "auto" (its JSON came back as content), and the text
remembered for its calls lacked them, so the next turn's prompt missed the cache from there. A request whose calls
are parsed shows its format's call tokens (only those) in the text calls are read from and remembered; a reply's
content and a request without calls parsed read as before."""

from __future__ import annotations

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
from radixcache.runtime.tools import assemble, normalize_tools, parse_tool_calls
from radixcache.runtime.tools.call_tokens import call_token_ids
from radixcache.runtime.tools.use import ToolUse
from tests.runtime.structured.conftest import PAGE, TOOLS, make_engine
from tests.runtime.tools.test_prefix import HERMES

ASK = [{"role": "user", "content": "What time is it?"}]
CALL = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
OPEN, CLOSE = 258, 259


@pytest.fixture(scope="module")
def engine(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    directory = tmp_path_factory.mktemp("special_calls") / "tiny"
    shutil.copytree(tiny_dir, directory)
    spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    for i, text in ((OPEN, "<tool_call>"), (CLOSE, "</tool_call>")):
        token = {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False}
        spec["added_tokens"].append({**token, "normalized": False, "special": True})
    (directory / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    (directory / "chat_template.jinja").write_text(HERMES, encoding="utf-8")
    with make_engine(directory) as e:
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


def test_the_call_tokens_are_the_formats_own(engine: Engine) -> None:
    assert call_token_ids(engine.tokenizer, "hermes") == {OPEN, CLOSE}
    assert call_token_ids(engine.tokenizer, "generic") == frozenset()
    ids = engine.tokenizer.encode(CALL, add_special_tokens=False)
    assert ids[0] == OPEN and ids[-1] == CLOSE
    specs = normalize_tools(TOOLS)
    shown = engine.tokenizer.decode(ids, keep={OPEN, CLOSE})
    assert shown == CALL and [c.name for c in parse_tool_calls(shown, specs, "hermes").tool_calls] == ["now"]
    with_eos = engine.tokenizer.decode([*ids, engine.eos_token_ids[0]], keep={OPEN, CLOSE})
    assert with_eos == CALL  # the end of turn is still not shown


def test_auto_parses_a_call_written_in_special_tokens_and_the_next_turn_extends_it(engine: Engine, writes: Any) -> None:
    emitted = writes("Let me look." + CALL)
    first = engine.chat(ASK, 100, tools=TOOLS, temperature=1.0)
    assert [(c.name, c.arguments) for c in first.tool_calls] == [("now", "{}")]
    assert (first.text, first.finish_reason, list(first.token_ids)) == ("Let me look.", "tool_calls", emitted)
    (call,) = first.tool_calls
    reply = {"role": "assistant", "content": first.text, "tool_calls": [call.to_openai()]}
    history = [*ASK, reply, {"role": "tool", "tool_call_id": call.id, "content": "12:00"}]
    use = ToolUse.of(TOOLS, "auto")
    before = engine.tokenizer.encode(engine._builder.render(ASK, use)) + emitted
    assert engine.tokenizer.encode(engine._builder.render(history, use))[: len(before)] == before
    writes("It is noon.")
    second = engine.chat(history, 100, tools=TOOLS, temperature=1.0)
    assert second.text == "It is noon." and second.cached_tokens >= (len(before) - 1) // PAGE * PAGE


def test_content_and_tool_choice_none_read_as_before(engine: Engine, writes: Any) -> None:
    writes(CALL)
    none = engine.chat(ASK, 100, tools=TOOLS, tool_choice="none", temperature=1.0)
    assert none.text == '\n{"name": "now", "arguments": {}}\n' and none.tool_calls == ()
    plain = engine.chat(ASK, 100, temperature=1.0)
    assert plain.text == none.text


def test_the_server_parses_it_whole_and_streamed(engine: Engine, writes: Any) -> None:
    writes("Let me look." + CALL)
    body = {"model": "tiny", "messages": ASK, "tools": TOOLS, "temperature": 1.0, "max_tokens": 100}
    with TestClient(create_app(engine, "tiny")) as client:
        (choice,) = client.post("/v1/chat/completions", json=body).json()["choices"]
        assert choice["message"]["content"] == "Let me look." and choice["finish_reason"] == "tool_calls"
        assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["now"]
        chunks = []
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
    content, calls = assemble(c["choices"][0]["delta"] for c in chunks if c["choices"])
    assert content == "Let me look." and [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("now", "{}")
    ]


@pytest.mark.parametrize("gap", ["", " ", "\n"])
def test_mistrals_calls_after_its_kept_token_are_calls(gap: str) -> None:
    specs = normalize_tools(TOOLS)
    text = (
        f'[TOOL_CALLS]{gap}[{{"name": "add", "arguments": {{"a": 1, "b": 2}}}}, {{"name": "now", "arguments": {{}}}}]'
    )
    result = parse_tool_calls(text, specs, "native")
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("add", {"a": 1, "b": 2}), ("now", {})]
    assert result.content is None and result.raw == text
    assert parse_tool_calls("[TOOL_CALLS] no calls", specs, "native").content == "[TOOL_CALLS] no calls"


def test_engine_stream_parses_it_as_the_result(engine: Engine, writes: Any) -> None:
    import asyncio

    writes("Let me look." + CALL)

    async def deltas() -> list[dict[str, Any]]:
        return [d async for d in engine.stream(ASK, 100, tools=TOOLS, temperature=1.0)]

    content, calls = assemble(asyncio.run(deltas()))
    assert content == "Let me look." and [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("now", "{}")
    ]


def test_a_forced_call_may_write_its_tags_as_the_special_tokens(engine: Engine) -> None:
    """Under "required" the grammar wrote `<tool_call>` as text only (the grammar engine never matches a special token
    with text), never the token a tokenizer that has it special trained its model to write. Now either: leaned to the
    token, the model writes it; leaned off, the text; the call is read both ways."""
    for lean in (100, -100):
        r = engine.chat(ASK, 200, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                        logit_bias={OPEN: lean, CLOSE: lean})  # fmt: skip
        assert r.finish_reason == "tool_calls" and len(r.tool_calls) == 1, r
        assert (r.token_ids[0] == OPEN) == (lean > 0)
        written = engine.tool_memory.lookup(r.tool_calls)
        assert written is not None and written.startswith("<tool_call>\n") and written.endswith("\n</tool_call>")
