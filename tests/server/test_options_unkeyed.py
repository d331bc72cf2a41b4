"""An OPTIONS request under --api-key (a browser's CORS preflight, which never carries the key) got 401, as if the
key were wrong. The server has no CORS support, so it answers OPTIONS as any method no route has: 405 with the
route's Allow (404 for an unknown path), keyed or not. In-process app over the tiny random model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

KEY = "sk-alice"
PREFLIGHT = {"Origin": "http://example.test", "Access-Control-Request-Method": "POST"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    m = tiny_model(seed=4)
    engine = Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=64)
    try:
        with TestClient(create_app(engine, "tiny", api_keys=[KEY])) as client:
            yield client
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("path", "allow"), [("/v1/chat/completions", "POST"), ("/v1/completions", "POST"), ("/v1/models", "GET")]
)
@pytest.mark.parametrize("keyed", [False, True])
def test_options_is_405_with_allow_whether_keyed_or_not(client: TestClient, path: str, allow: str, keyed: bool) -> None:
    headers = {**PREFLIGHT, **({"Authorization": f"Bearer {KEY}"} if keyed else {})}
    reply = client.options(path, headers=headers)
    assert reply.status_code == 405, reply.text
    assert reply.headers["allow"] == allow
    assert reply.json()["error"]["code"] is None  # not invalid_api_key
    assert "access-control-allow-origin" not in reply.headers  # no CORS: a browser's cross-origin call stays refused


def test_other_methods_still_need_the_key(client: TestClient) -> None:
    assert client.put("/v1/chat/completions").status_code == 401  # refused before its body is read, as before
    assert client.post("/v1/completions", json={}).json()["error"]["code"] == "invalid_api_key"
    assert client.options("/v1/nowhere").status_code == 404
