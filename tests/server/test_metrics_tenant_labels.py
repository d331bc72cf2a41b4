"""Per-namespace metrics labels are bounded per tenant. They were bounded in all only: past 256 namespaces every new
one counted as `other` until a restart, and each `cache_salt` is a namespace, so one key sending 256 requests under
new salts took every label and each tenant after it (its key, its salts) read as `other`. A tenant (a key with its
salts, keyless callers together) now labels its unsalted namespace and a few salted ones, and its later salts count
under its own `other-<its key's label>`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.server import metrics
from radixcache.runtime.server.generation import namespace_for
from radixcache.runtime.server.metrics import ServerMetrics, namespace_label
from tests.server.keyed_tiny import keyed_client, tiny_engine

REQUESTS = re.compile(r'^radixcache_namespace_requests_total\{namespace="([^"]+)"\} (\d+)$', re.M)


@pytest.fixture
def small_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "MAX_NAMESPACE_LABELS", 5)
    monkeypatch.setattr(metrics, "MAX_TENANT_LABELS", 2, raising=False)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with tiny_engine(tmp_path_factory, "metrics_tenant_labels") as engine:
        yield engine


def _counts(text: str) -> dict[str, int]:
    return {label: int(n) for label, n in REQUESTS.findall(text)}


def test_a_key_salting_every_request_leaves_other_tenants_their_labels(engine: Engine, small_budgets: None) -> None:
    with keyed_client(engine) as client:

        def ask(key: str, salt: str | None = None) -> None:
            body = {"model": "tiny", "prompt": "hi", "max_tokens": 1, **({"cache_salt": salt} if salt else {})}
            r = client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text

        for i in range(8):  # more salts than all the labels
            ask("sk-bob", f"salt-{i}")
        ask("sk-alice")
        ask("sk-alice", "a")
        text = client.get("/metrics", headers={"Authorization": "Bearer sk-alice"}).text
    bob = namespace_label(namespace_for("sk-bob"))
    expected = {namespace_label(namespace_for("sk-bob", f"salt-{i}")): 1 for i in range(2)}
    expected |= {f"other-{bob}": 6, namespace_label(namespace_for("sk-alice")): 1}
    expected[namespace_label(namespace_for("sk-alice", "a"))] = 1
    assert _counts(text) == expected


def test_past_the_labels_in_all_each_tenant_counts_under_its_own_overflow(small_budgets: None) -> None:
    seen = ServerMetrics()
    result = SimpleNamespace(ttft_s=0.1, tpot_s=0.0, token_ids=[1], prompt_tokens=3, cached_tokens=0)
    tenants = ["sk-1", "sk-2", "sk-3", "sk-4", None]
    for key in tenants:
        for salt in ("a", "b", "c"):
            seen.observe(result, namespace_for(key, salt))
    seen.observe(result, namespace_for("sk-4"))  # a key alone (no salt) is always labelled, as keyless callers are
    seen.observe(result, None)
    labels = _counts("\n".join(seen._namespace_lines()))
    own = {
        namespace_label(namespace_for(k, s)): 1
        for k, salts in [("sk-1", "ab"), ("sk-2", "ab"), ("sk-3", "a")]
        for s in salts
    }
    overflow = {
        "other-" + namespace_label(namespace_for("sk-1")): 1,
        "other-" + namespace_label(namespace_for("sk-2")): 1,
    }
    overflow |= {
        "other-" + namespace_label(namespace_for("sk-3")): 2,
        "other-" + namespace_label(namespace_for("sk-4")): 3,
    }
    overflow |= {"other-default": 3, namespace_label(namespace_for("sk-4")): 1, "default": 1}
    assert labels == own | overflow
