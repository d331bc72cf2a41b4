"""Under --api-key: requests need a key, and each key is its own cache namespace."""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.xdist_group("keyed_server")  # the shared server (conftest.py)
PROMPT = "A long shared preamble that both tenants send word for word, to tempt the cache. " * 3


def _client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0, timeout=60)


def test_missing_or_wrong_key_is_401(keyed_server) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(keyed_server.v1 + "/chat/completions", json=body, timeout=10).status_code == 401
    r = httpx.post(
        keyed_server.v1 + "/chat/completions", json=body, headers={"Authorization": "Bearer sk-eve"}, timeout=10
    )
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    bad_json = {"content": b"{not json", "headers": {"content-type": "application/json"}, "timeout": 10}
    assert httpx.post(keyed_server.v1 + "/chat/completions", **bad_json).status_code == 401  # auth before the body
    with pytest.raises(openai.AuthenticationError):
        _client(keyed_server, "sk-eve").models.list()


def test_one_tenant_never_hits_another_tenants_prefix(keyed_server) -> None:
    def cached(key: str) -> int:
        r = _client(keyed_server, key).completions.create(model="tiny", prompt=PROMPT, max_tokens=2, temperature=0)
        return r.usage.prompt_tokens_details.cached_tokens

    assert cached("sk-alice") == 0
    assert cached("sk-alice") > 0  # alice's own prefix
    assert cached("sk-bob") == 0  # the same prompt, another tenant
    other = "Alice's private preamble, which Bob tries to reach by naming a namespace himself. " * 3
    _client(keyed_server, "sk-alice").completions.create(model="tiny", prompt=other, max_tokens=1)
    for salt in ("alice", "sk-alice"):
        smuggled = _client(keyed_server, "sk-bob").completions.create(
            model="tiny", prompt=other, max_tokens=1, extra_body={"cache_salt": salt, "user": "alice"}
        )
        assert smuggled.usage.prompt_tokens_details.cached_tokens == 0  # a salt only splits a tenant's namespace
    with pytest.raises(openai.BadRequestError, match="namespace"):  # no field names a namespace
        _client(keyed_server, "sk-bob").completions.create(
            model="tiny", prompt=other, max_tokens=1, extra_body={"namespace": None}
        )
    assert cached("sk-bob") > 0


def test_metrics_need_a_key_under_api_keys(keyed_server) -> None:
    assert httpx.get(keyed_server.url + "/metrics", timeout=10).status_code == 401
    r = httpx.get(keyed_server.url + "/metrics", headers={"Authorization": "Bearer sk-bob"}, timeout=10)
    assert r.status_code == 200 and "radixcache_" in r.text


@pytest.mark.slow
def test_public_metrics_opts_out(tiny_model_dir, launch) -> None:
    with launch(tiny_model_dir, "--api-key", "sk-alice", "--public-metrics") as s:
        assert httpx.get(s.url + "/metrics", timeout=10).status_code == 200
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(s.v1 + "/chat/completions", json=body, timeout=10).status_code == 401
