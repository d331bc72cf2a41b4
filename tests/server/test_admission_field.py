"""The `retain` request field and the admission metric, on an in-process app over an engine whose admission policy
declines every page: "conversation" keeps a request's pages for its next turn, a bad value is a 400 naming the
field, and /metrics counts the declined pages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from radixcache.policy.admission import AdmissionPolicy, AdmissionRequest
from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

P = 4
PROMPT = list(range(1, 31))  # 30 token ids: 7 whole pages before the last token


class DeclineAll(AdmissionPolicy):
    name = "decline"

    def decide(self, request: AdmissionRequest) -> int:
        return 0


@pytest.fixture
def app_client() -> Iterator[tuple[TestClient, Engine]]:
    m = tiny_model(seed=4)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    engine = Engine(model, capacity_blocks=128, page_size=P, admission=DeclineAll())
    with TestClient(create_app(engine, "tiny")) as client:
        yield client, engine
    engine.close()


def _cached(client: TestClient, prompt: list[int], **extra: object) -> int:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 3, "temperature": 0, **extra}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def _declined(client: TestClient) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("radixcache_admission_declined_pages_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no radixcache_admission_declined_pages_total in /metrics")


def test_retain_conversation_keeps_the_pages_a_declining_policy_would_free(app_client) -> None:
    client, engine = app_client
    assert _cached(client, PROMPT) == 0
    assert _cached(client, PROMPT) == 0, "the policy declined every page of the first request"
    declined = _declined(client)
    assert declined == engine.stats.admission_declined_pages > 0
    assert _cached(client, PROMPT, retain="conversation") == 0
    assert _cached(client, PROMPT, retain=None) == (len(PROMPT) - 1) // P * P, "the retained request's pages"
    assert _declined(client) > declined  # the last request (no hint) declined its own reply's pages again
    engine.check()


def test_chat_accepts_retain_and_hits_the_whole_previous_turn(app_client) -> None:
    client, _ = app_client
    messages = [{"role": "user", "content": "hello there, how are you today?"}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0, "retain": "conversation"}
    first = client.post("/v1/chat/completions", json=body)
    assert first.status_code == 200, first.text
    again = client.post("/v1/chat/completions", json=body)
    prompt_tokens = again.json()["usage"]["prompt_tokens"]
    # Every full page of the prompt; a full last page too, but for its last position (computed for the logits).
    want = prompt_tokens - 1 if prompt_tokens % P == 0 else (prompt_tokens - 1) // P * P
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == want


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("value", ["forever", "Conversation", 1, ["conversation"]])
def test_a_bad_retain_is_a_400_naming_the_field(app_client, endpoint: str, value: object) -> None:
    client, engine = app_client
    body: dict[str, object] = {"model": "tiny", "max_tokens": 2, "retain": value}
    body |= {"prompt": PROMPT} if endpoint == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    r = client.post(endpoint, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "retain" and "retain" in error["message"]
    assert engine.stats.requests == 0, "nothing reached the engine"
