"""HEAD is answered wherever GET is: uptime monitors probe /health with HEAD, and FastAPI answered 405 (so the
server read as down). Under a real uvicorn on the tiny random model: the status and headers of GET, no body, the
key check kept, and no HEAD operation in the OpenAPI schema the schemathesis tests fuzz."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.server.uvicorn_thread import serving

KEY = "sk-alice"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    m = tiny_model(seed=4)
    engine = Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=64)
    try:
        with serving(create_app(engine, "tiny", api_keys=[KEY])) as port:
            yield f"http://127.0.0.1:{port}"
    finally:
        engine.close()


@pytest.mark.parametrize("path", ["/health", "/health/cache", "/metrics", "/v1/models", "/v1/models/tiny"])
def test_head_answers_as_get_does_without_a_body(url: str, path: str) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    get, head = httpx.get(url + path, headers=auth), httpx.head(url + path, headers=auth)
    assert get.status_code == 200
    assert head.status_code == 200, head.text
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.content == b""
    if path == "/health":  # the same body, unsent
        assert int(head.headers["content-length"]) == len(get.content)


def test_head_keeps_the_key_check_and_the_unknown_answers(url: str) -> None:
    assert httpx.head(url + "/v1/models").status_code == 401
    assert httpx.head(url + "/health").status_code == 200  # /health is public, as its GET is
    assert httpx.head(url + "/v1/models/other", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404
    assert httpx.head(url + "/nowhere").status_code == 404


def test_the_schema_has_no_head_operations(url: str) -> None:
    paths = httpx.get(url + "/openapi.json").json()["paths"]
    assert "get" in paths["/health"]
    assert not [p for p, ops in paths.items() if "head" in ops]
