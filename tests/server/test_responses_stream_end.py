"""A streamed Responses answer whose last events fail to build (the response's store breaking, say): they were
built after the stream's error handling, so the stream stopped after the items' events with neither an `error`
event nor `response.failed`, and the failure went uncounted. Now it ends as a failure mid-stream does, the request's
pages released and the server serving on. In-process app over the tiny CharTokenizer engine, a real HTTP client."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime.server import create_app
from radixcache.runtime.server.responses_store import ResponseStore
from tests.server.test_error_paths import _engine

BODY = {"model": "tiny", "input": "hi", "max_output_tokens": 3, "temperature": 0, "stream": True}


def _events(client: TestClient) -> list[dict[str, Any]]:
    with client.stream("POST", "/v1/responses", json=BODY) as r:
        assert r.status_code == 200
        return [json.loads(line[len("data: ") :]) for line in r.iter_lines() if line.startswith("data: ")]


def _metric(client: TestClient, name: str) -> float:
    line = next(x for x in client.get("/metrics").text.splitlines() if x.startswith(name + "{"))
    return float(line.split()[-1])


def test_a_failure_building_the_last_events_ends_the_stream_with_error_and_response_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = _engine()

    def broken(self: ResponseStore, *args: object) -> bool:
        raise RuntimeError("the response store broke")

    try:
        with TestClient(create_app(engine, "tiny"), raise_server_exceptions=False) as client:
            failed = _metric(client, "radixcache_http_requests_failed_total")
            monkeypatch.setattr(ResponseStore, "put", broken)
            events = _events(client)
            kinds = [e["type"] for e in events]
            assert kinds[:2] == ["response.created", "response.in_progress"]
            assert kinds[-2:] == ["error", "response.failed"], kinds
            assert "response.completed" not in kinds and "response.incomplete" not in kinds
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            assert events[-1]["response"]["status"] == "failed"
            assert "the response store broke" in events[-2]["message"]  # an internal error: code null, as mid-stream
            assert events[-1]["response"]["error"]["code"] == "server_error"
            assert _metric(client, "radixcache_http_requests_failed_total") == failed + 1
            deadline = time.monotonic() + 20  # the stream's request is over: nothing running, nothing locked
            while (gauges := engine.check())["running"] and time.monotonic() < deadline:
                pass
            assert gauges["running"] == gauges["waiting"] == gauges["locked_blocks"] == 0
            rid = events[-1]["response"]["id"]
            assert client.get(f"/v1/responses/{rid}").status_code == 404  # not stored
            monkeypatch.undo()
            again = _events(client)  # the server serves on, and stores the answer
            assert again[-1]["type"] in ("response.completed", "response.incomplete")  # 3 tokens: cut, or ended
            assert client.get(f"/v1/responses/{again[-1]['response']['id']}").status_code == 200
    finally:
        engine.close()
