"""A Responses reply cut by max_output_tokens after its call's arguments closed (in the closing `</tool_call>` tag
here): the call was made, so its item is complete, in the whole answer and in the stream's final output alike (the
whole answer marked it incomplete); a reply cut inside the arguments keeps the call incomplete in both. A stop
string inside them cut them too (the call marked incomplete in a completed response); under the named choice's
grammar it no longer cuts them (a stop string ends a grammar's output only where it is complete). A named
tool_choice on the tiny Hermes checkpoint writes one exact text, whose byte tokens cut it anywhere."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from tests.runtime.tools.test_prefix import HERMES
from tests.tiny_tools import TOOLS

pytestmark = pytest.mark.xdist_group("responses_cut_calls")  # its module-scoped engine, built once
WRITTEN = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'  # the forced call, one token a byte


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    from tests.cli.conftest import write_tiny_checkpoint

    model = write_tiny_checkpoint(tmp_path_factory.mktemp("responses_cut") / "tiny")
    (model / "chat_template.jinja").write_text(HERMES, encoding="utf-8")
    engine = Engine(str(model), capacity_blocks=256, page_size=4, dtype="float64", threads=1)
    with TestClient(create_app(engine, "tiny")) as c:
        yield c
    engine.close()


def _items(output: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(i["type"], i["status"], i.get("name"), i.get("arguments")) for i in output]


def _both(client: TestClient, limit: int, **kw: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    body = {"model": "tiny", "input": "hi", "tools": tools, "tool_choice": {"type": "function", "name": "now"}}
    body |= {"max_output_tokens": limit, "temperature": 0, **kw}
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    return r.json(), events[-1]["response"]["output"]


def test_a_call_cut_after_its_arguments_closed_is_complete_whole_and_streamed(client) -> None:
    whole, _ = _both(client, 200)
    assert whole["status"] == "completed" and whole["usage"]["output_tokens"] >= len(WRITTEN)  # (an EOS or not)
    assert _items(whole["output"]) == [("function_call", "completed", "now", "{}")]
    closed = WRITTEN.index("{}") + 2  # the arguments' last byte
    for limit, status in ((closed - 1, "incomplete"), (closed, "completed"), (len(WRITTEN) - 1, "completed")):
        whole, streamed = _both(client, limit)
        assert whole["status"] == "incomplete" and whole["usage"]["output_tokens"] == limit
        expected = [("function_call", status, "now", WRITTEN[WRITTEN.index("{}") : min(limit, closed)])]
        assert _items(whole["output"]) == expected, limit
        assert _items(streamed) == _items(whole["output"]), limit


def test_a_stop_string_inside_a_required_call_does_not_cut_it(client) -> None:
    whole, streamed = _both(client, 200, stop=["}}"])  # inside `{"name": "now", "arguments": {}}`
    assert whole["status"] == "completed" and _items(whole["output"]) == [("function_call", "completed", "now", "{}")]
    assert _items(streamed) == _items(whole["output"])
