"""Tenant timing: under --api-key, a prober's time to first token tells nothing about another tenant's prompts.
Probes whose long prefix another tenant has just sent ("other sent") and probes whose prefix nobody sent ("fresh")
are interleaved; a rank statistic (the Mann-Whitney AUC of "other sent is faster") stays near 0.5, while the same
tenant re-sending its own prefix is clearly faster (its pages are cached for it). Each key is its own cache
namespace (runtime.server.generation.namespace_for), so another tenant's pages are never a hit."""

from __future__ import annotations

import random
import statistics
import time

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tenant_timing")]

ROUNDS = 24  # per kind; the AUC's null spread is then about 0.08
PREFIX_CHARS = 1500  # byte tokens: 1,500 tokens of prefill, or one page of it on a hit


@pytest.fixture(scope="module")
def keyed(tiny_model_dir, launch):
    args = ("--api-key", "sk-alice", "--api-key", "sk-bob", "--capacity-blocks", "4096")
    with launch(tiny_model_dir, *args) as server:
        yield server


def _ttft(http: httpx.Client, key: str, prompt: str) -> float:
    """Seconds to the whole answer of a one-token completion (the prefill, then one token)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    start = time.perf_counter()
    r = http.post("/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    elapsed = time.perf_counter() - start
    assert r.status_code == 200, r.text
    return elapsed


def auc(faster: list[float], slower: list[float]) -> float:
    """P(a value of `faster` is below one of `slower`), ties counting half: 0.5 when they are indistinguishable."""
    wins = sum((x < y) + 0.5 * (x == y) for x in faster for y in slower)
    return wins / (len(faster) * len(slower))


def test_another_tenants_prefix_gives_no_timing_signal_while_own_hits_stay_fast(keyed) -> None:
    rng = random.Random(31)
    letters = "abcdefghijklmnopqrstuvwxyz "

    def prefix() -> str:
        return "".join(rng.choice(letters) for _ in range(PREFIX_CHARS))

    other_sent, fresh, own_hit, own_miss = [], [], [], []
    with httpx.Client(base_url=keyed.v1, timeout=60) as http:
        _ttft(http, "sk-bob", prefix())  # warm up
        for i in range(ROUNDS):
            kinds = ["other", "fresh"] if i % 2 == 0 else ["fresh", "other"]
            for kind in kinds:
                p = prefix()
                if kind == "other":
                    _ttft(http, "sk-alice", p + " alice")  # alice's pages for p are now cached, for alice
                    other_sent.append(_ttft(http, "sk-bob", p + " bob"))
                else:
                    fresh.append(_ttft(http, "sk-bob", p + " bob"))
            if i % 2 == 0:  # the control: alice's own prefix is a hit for alice
                p = prefix()
                own_miss.append(_ttft(http, "sk-alice", p + " one"))
                own_hit.append(_ttft(http, "sk-alice", p + " two"))
    leak = auc(other_sent, fresh)
    own = auc(own_hit, own_miss)
    print(
        f"AUC(other tenant's prefix faster)={leak:.3f}  AUC(own hit faster)={own:.3f}  medians ms: "
        f"other={1e3 * statistics.median(other_sent):.1f} fresh={1e3 * statistics.median(fresh):.1f} "
        f"own hit={1e3 * statistics.median(own_hit):.1f} own miss={1e3 * statistics.median(own_miss):.1f}"
    )
    assert leak <= 0.66, leak
    assert own >= 0.75 and statistics.median(own_hit) < 0.8 * statistics.median(own_miss), (own_hit, own_miss)
