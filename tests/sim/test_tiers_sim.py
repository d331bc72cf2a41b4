"""The tiered replay: hits per tier worked out by hand for each write policy, the modelled TTFT, agreement with the
device-only replay, the tiers' invariants, and the CLI's flags."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.cli.simulate_tables import print_json
from radixcache.errors import RadixCacheError
from radixcache.sim.evaluation import evaluate
from radixcache.sim.simulation import simulate
from radixcache.sim.tiered_replay import TieredReplay
from radixcache.sim.tiers import DEFAULT_TIER_COSTS, LatencyDigest, TierConfig, TierCosts
from radixcache.trace import HashRequest
from radixcache.trace.synthetic import multi_turn_chat
from radixcache.trace.workload import Workload, hash_workload, token_workload

BLOCK = 16  # tokens per hash id in the hand-worked traces: one page of 16 tokens, the cost model's own page
COSTS = TierCosts(prefill_ms_per_token=1.0, host_load_ms_per_page=2.0, disk_load_ms_per_page=8.0)
A, B, C = (1, 2), (3, 4), (5, 6)  # two pages each: 32 tokens, 32 ms to prefill, 4 ms from the host, 16 from disk


def hashes(*prompts: tuple[int, ...]) -> Workload:
    return hash_workload(
        [HashRequest(i, BLOCK * len(p), 1, p) for i, p in enumerate(prompts)],
        block_size=BLOCK,
    )


def tiered(workload: Workload, capacity: int, host: int | None, disk: int | None = None, policy: str = "write_through"):
    return simulate(workload, capacity, tiers=TierConfig(host, disk, policy, COSTS), check=True)


@pytest.fixture(scope="module")
def chat() -> Workload:
    return token_workload(multi_turn_chat(conversations=25, turns=(2, 5), system_tokens=300, seed=3), page_size=8)


# --------------------------------------------------------------------------------------------- worked by hand

# A B A C B C through a device of 2 pages (one request's worth: each request evicts the one before) and a host of 4.
#  write_through: every adopted page is copied to the host at once. A(3) finds A (host: A B). C(4) adopts C,
#    pushing B out of the host (A C). B(5) misses, and adopting B pushes A out (C B). C(6) finds C. Host hits:
#    A(3) and C(6): 64 tokens, 4 pages.
#  write_back: a page reaches the host only when the device evicts it. B(2) evicts A (host: A). A(3) finds A and
#    evicts B (A B). C(4) evicts A (already there). B(5) finds B: C, still on the device, was never copied over it.
#    B evicts C (B C; A, the least recent, goes). C(6) finds C. Host hits: A(3), B(5), C(6): 96 tokens.
#  write_through_selective: no node is ever hit twice on the device, so nothing is backed up: no host hits.
HAND = hashes(A, B, A, C, B, C)


@pytest.mark.parametrize(
    ("policy", "host_tokens"), [("write_through", 64), ("write_back", 96), ("write_through_selective", 0)]
)
def test_hits_per_write_policy_worked_by_hand(policy: str, host_tokens: int) -> None:
    r = tiered(HAND, 2, 4, policy=policy)
    assert r.tiers is not None
    assert r.tiers.hit_tokens == {"device": 0, "host": host_tokens}
    assert r.tiers.loaded_blocks == {"host": host_tokens // BLOCK}
    assert (r.hit_tokens, r.hit_blocks, r.prompt_tokens) == (host_tokens, host_tokens // BLOCK, 6 * 32)
    assert r.tiers.tier_hit_rate == {"device": 0.0, "host": host_tokens / 192}
    assert r.evicted_blocks == simulate(HAND, 2).evicted_blocks == 10  # the device is the same, tiers or not


def test_write_back_keeps_what_the_device_still_holds_out_of_the_host() -> None:
    # The difference by hand: at B(5), write_through's host has B's copies pushed out by C's (adopted while C was
    # still on the device); write_back's host still holds B, since C's pages were never copied.
    through, back = tiered(HAND, 2, 4), tiered(HAND, 2, 4, policy="write_back")
    assert back.hit_tokens - through.hit_tokens == 32
    assert (through.tiers.tier_stats["host"].stored, back.tiers.tier_stats["host"].stored) == (8, 6)


def test_selective_backs_up_a_page_hit_twice() -> None:
    # A A A B A: A's node is hit at A(2) and A(3), so A(3) backs it up; B evicts it from the device; A(5) loads
    # it from the host under every policy (write_back copies it when B evicts it).
    w = hashes(A, A, A, B, A)
    for policy in ("write_through", "write_through_selective", "write_back"):
        assert tiered(w, 2, 4, policy=policy).tiers.hit_tokens == {"device": 64, "host": 32}
    assert tiered(hashes(A, A, B, A), 2, 4, policy="write_through_selective").tiers.hit_tokens["host"] == 0


def test_the_disk_takes_every_adopted_page_and_serves_what_the_host_lost() -> None:
    # write_through with a disk of 8: B(5), gone from the host, is on the disk.
    r = tiered(HAND, 2, 4, disk=8)
    assert r.tiers.hit_tokens == {"device": 0, "host": 64, "disk": 32}
    assert r.tiers.loaded_blocks == {"host": 4, "disk": 2}
    assert (r.tiers.tier_stats["disk"].stored, r.tiers.tier_stats["disk"].pages) == (6, 6)
    # A disk without a host: every repeat is a disk hit.
    alone = tiered(HAND, 2, None, disk=8)
    assert alone.tiers.hit_tokens == {"device": 0, "disk": 96}


def test_modelled_ttft_worked_by_hand() -> None:
    # write_through + disk: A B miss (32 ms each), A from the host (2 pages: 4 ms), C misses, B from the disk
    # (2 pages: 16 ms), C from the host (4 ms): 32 32 4 32 16 4.
    t = tiered(HAND, 2, 4, disk=8).tiers
    assert t.ttft.mean_s == pytest.approx(0.120 / 6)
    assert (t.ttft.p50_s, t.ttft.p99_s, t.ttft.max_s) == pytest.approx((0.016, 0.032, 0.032))
    assert (t.ttft_device_only.mean_s, t.ttft_device_only.p50_s) == pytest.approx((0.032, 0.032))
    assert (t.ttft_no_cache.mean_s, t.ttft_no_cache.p99_s) == pytest.approx((0.032, 0.032))


def test_a_tier_dearer_than_recomputing_is_not_loaded() -> None:
    # A disk page costs 20 ms to load, its 16 tokens 16 ms to recompute: B(5) is recomputed (a miss).
    costs = dataclasses.replace(COSTS, disk_load_ms_per_page=20.0)
    r = simulate(HAND, 2, tiers=TierConfig(4, 8, costs=costs), check=True)
    assert r.tiers.hit_tokens == {"device": 0, "host": 64, "disk": 0}
    assert r.tiers.tier_stats["disk"].hit_pages == 2  # found, not loaded
    assert r.tiers.ttft.mean_s == pytest.approx((32 * 4 + 4 + 4) / 6 / 1000)


def test_per_page_costs_scale_with_the_page_tokens() -> None:
    d = DEFAULT_TIER_COSTS
    assert (d.prefill_ms_per_token, d.host_load_ms_per_page, d.disk_load_ms_per_page) == (2.74, 0.56, 1.87)
    assert d.load_s_per_page("host", 512) == pytest.approx(0.56e-3 * 32)
    assert d.load_s_per_page("disk", 4) == pytest.approx(1.87e-3 / 4)
    assert d.loads("host", 512) and d.loads("disk", 16)
    with pytest.raises(RadixCacheError, match="prefill_ms_per_token"):
        TierCosts(prefill_ms_per_token=-1)
    with pytest.raises(RadixCacheError, match="write_policy"):
        TierConfig(4, write_policy="write_around")
    with pytest.raises(RadixCacheError, match="host_capacity_blocks"):
        TierConfig(0)
    # A host write policy without a host tier had no effect through the library (the CLI refused it)
    with pytest.raises(RadixCacheError, match=r"write_back.*needs host_capacity_blocks"):
        TierConfig(None, 64, "write_back")
    assert TierConfig(None, 64).write_policy == "write_through"


def test_a_partial_last_block_counts_its_own_tokens() -> None:
    # A of 20 tokens (16 + 4), then B, then A again from the host: 20 tokens hit, not 32.
    w = hash_workload([HashRequest(0, 20, 1, A), HashRequest(1, 32, 1, B), HashRequest(2, 20, 1, A)], BLOCK)
    r = simulate(w, 2, tiers=TierConfig(4, costs=COSTS), check=True)
    assert r.tiers.hit_tokens == {"device": 0, "host": 20}
    assert r.tiers.ttft.max_s == pytest.approx(0.032)  # B; A(3) costs 2 page loads: 4 ms


# --------------------------------------------------------------------------------------------- against the device


def test_no_tiers_gives_exactly_the_device_only_figures(chat: Workload) -> None:
    for concurrency in (1, 3):
        base = simulate(chat, 120, concurrency=concurrency)
        alone = simulate(chat, 120, concurrency=concurrency, tiers=TierConfig())
        assert dataclasses.replace(alone, seconds=0, tiers=None) == dataclasses.replace(base, seconds=0)
        assert alone.tiers.hit_tokens == {"device": base.hit_tokens}
        assert alone.tiers.ttft == alone.tiers.ttft_device_only


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_tiers_add_hits_on_a_chat_trace_and_keep_their_invariants(chat: Workload, policy: str) -> None:
    base = simulate(chat, 120, concurrency=2)
    r = simulate(chat, 120, concurrency=2, tiers=TierConfig(200, 600, policy), check=True)
    t = r.tiers
    assert t.hit_tokens["device"] == base.hit_tokens  # the device holds the same pages with tiers or without
    assert sum(t.hit_tokens.values()) == r.hit_tokens
    assert sum(t.tier_hit_rate.values()) == pytest.approx(r.hit_rate)
    assert r.hit_rate > base.hit_rate and t.hit_tokens["host"] > 0 and t.hit_tokens["disk"] > 0
    assert r.hit_rate <= evaluate(chat, 120, concurrency=2).infinite.hit_rate + 1e-12
    assert t.ttft.mean_s < t.ttft_device_only.mean_s < t.ttft_no_cache.mean_s
    assert t.key == "blake2b"


@pytest.mark.parametrize("policy", ["reuse", "lfu", "cost"])
def test_the_device_hits_are_the_device_alones_under_any_policy(chat: Workload, policy: str) -> None:
    """Regression: the tiered replay never told `reuse` a request's output length, which the device alone's replay
    does, so with tiers it learned other classes and the device hit other pages than it does alone (on the Mooncake
    trace at 2,196 blocks: 9,735,996 device hit tokens against 9,495,335)."""
    for concurrency in (1, 3):
        base = simulate(chat, 120, policy, concurrency=concurrency)
        r = simulate(chat, 120, policy, concurrency=concurrency, tiers=TierConfig(200, 600))
        assert (r.tiers.hit_tokens["device"], r.evicted_blocks) == (base.hit_tokens, base.evicted_blocks)


def recorded_trace() -> Workload:
    """A trace an engine recorded: finish times (requests overlap), and the pages the engine's tree got past each
    prompt's whole pages, which ends in a partial block (held while it ran)."""
    rng = random.Random(0)
    documents = [tuple(range(100 * d, 100 * d + 6)) for d in range(8)]
    requests, t = [], 0.0
    for i in range(300):
        t += rng.choice([1, 5, 20])
        ids = (*documents[rng.randrange(8)][: rng.randint(2, 6)], 10_000 + i)
        output = (20_000 + i,) if rng.random() < 0.5 else ()
        finish = t + rng.choice([2, 30, 100])
        requests.append(HashRequest(t, 4 * len(ids) - 1, 5, ids, output_hash_ids=output, finish_timestamp_ms=finish))
    return hash_workload(requests, 4)


@pytest.mark.parametrize("capacity", [8, 20])
def test_a_recorded_trace_keeps_the_device_alones_figures(capacity: int) -> None:
    """Regression: the tiered replay ran a recorded request as any other: it neither held the page the engine was
    still writing nor shared the prompt's pages from the request's start, as the device alone's replay does, so the
    device hit 596 tokens with tiers against 1,068 alone (8 blocks). The docs: recorded outputs work as without
    tiers, and the device holds the same pages either way."""
    workload = recorded_trace()
    base = simulate(workload, capacity, "lru")
    r = simulate(workload, capacity, "lru", tiers=TierConfig(50, 80), check=True)
    assert (r.tiers.hit_tokens["device"], r.evicted_blocks) == (base.hit_tokens, base.evicted_blocks)
    assert r.hit_tokens > base.hit_tokens  # the tiers still add hits


def test_the_invariants_hold_after_a_replay(chat: Workload) -> None:
    replay = TieredReplay(chat, 100, "slru", tiers=TierConfig(150, 300, "write_back"), concurrency=4)
    for index, request in enumerate(chat):
        replay.feed(index, request)
    replay.close()
    replay.tiered.check_invariants()
    replay.disk.check_invariants()
    assert replay.host.locked_count == 0 and replay.cache.locked_blocks == 0


def test_hash_ids_key_the_tiers_as_blake2b_does_on_a_chained_trace() -> None:
    # Random prompts over a small trie of pages, each page numbered once: chained ids, as Mooncake's.
    rng = random.Random(5)
    ids: dict[tuple[int, int], int] = {}
    prompts = []
    for _ in range(150):
        prompt, parent = [], -1
        for _ in range(rng.randint(1, 6)):
            parent = ids.setdefault((parent, rng.randint(0, 2)), len(ids))
            prompt.append(parent)
        prompts.append(tuple(prompt))
    w = hashes(*prompts)
    for policy in ("write_through", "write_through_selective", "write_back"):
        runs = []
        for key in ("hash-id", "blake2b"):
            replay = TieredReplay(w, 8, tiers=TierConfig(10, 20, policy), key=key, check=True)
            for index, request in enumerate(w):
                replay.feed(index, request)
            replay.close()
            runs.append(replay.result())
        assert runs[0].tiers.hit_tokens == runs[1].tiers.hit_tokens
        assert runs[0].tiers.hit_tokens["host"] > 0


def test_ids_that_are_not_chained_fall_back_to_blake2b_keys() -> None:
    # Id 2 follows 1, then 3: keyed by id, [3, 2] would find the host's copy of [1, 2]'s second page.
    w = hashes((1, 2), (3, 4), (3, 2))
    assert simulate(w, 2, tiers=TierConfig(4)).tiers.hit_tokens == {"device": 16, "host": 16}  # wrong, as documented
    report = evaluate(w, 2, tiers=TierConfig(4))
    assert report.result.tiers.key == "blake2b"
    assert report.result.tiers.hit_tokens == {"device": 16, "host": 0}


def test_oracle_policies_stay_device_only(chat: Workload) -> None:
    with pytest.raises(RadixCacheError, match="without tiers"):
        simulate(chat, 50, "belady", tiers=TierConfig(10))


# --------------------------------------------------------------------------------------------- the TTFT digest


def test_the_digest_is_exact_then_within_its_bucket_width() -> None:
    d = LatencyDigest()
    for v in (0.0, 3.0, 1.0, 2.0):
        d.add(v)
    assert (d.percentile(0.5), d.percentile(0.99), d.summary().mean_s) == (1.0, 3.0, 1.5)
    big = LatencyDigest()
    n = LatencyDigest.EXACT + 10_000
    values = [((i * 7919) % n) / n for i in range(n)]  # 0 .. 1, each once
    for v in values:
        big.add(v)
    assert big.values is None  # moved to the histogram
    exact = sorted(values)
    for q in (0.5, 0.99):
        want = exact[-(-int(q * n * 1e6) // 1_000_000) - 1]
        assert big.percentile(q) == pytest.approx(want, rel=6e-4)
    assert big.summary().mean_s == pytest.approx(sum(values) / n)
    assert big.summary().max_s == max(values)


# --------------------------------------------------------------------------------------------- the CLI


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def chat_file(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    assert run("trace", "gen", "chat", str(path), "--count", "20", "--set", "turns=2,4")[0] == 0
    return path


def test_cli_json_has_the_tier_keys(chat_file: Path) -> None:
    args = ["simulate", str(chat_file), "--capacity-blocks", "100", "--page-size", "4", "--json"]
    code, out, _ = run(*args, "--host-capacity-blocks", "200", "--disk-capacity-blocks", "800")
    assert code == 0
    report = json.loads(out)
    for key in ("hit_rate", "tier_hit_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "device_only", "no_cache"):
        assert key in report
    rates = report["tier_hit_rate"]
    assert set(rates) == {"device", "host", "disk"}
    assert sum(rates.values()) == pytest.approx(report["hit_rate"])
    assert report["write_policy"] == "write_through"
    assert report["costs"]["prefill_ms_per_token"] == DEFAULT_TIER_COSTS.prefill_ms_per_token
    assert report["hit_rate"] <= report["infinite_hit_rate"]
    plain = json.loads(run(*args)[1])
    assert plain["hit_rate"] == rates["device"] == report["device_only"]["hit_rate"]
    assert "tier_hit_rate" not in plain and "ttft_p50_s" not in plain
    code, out, _ = run(*args, "--disk-capacity-blocks", "800", "--prefill-ms-per-token", "0")
    assert code == 0 and json.loads(out)["tier_hit_rate"] == {"device": plain["hit_rate"], "disk": 0.0}


def test_cli_table_shows_the_tiers(chat_file: Path) -> None:
    code, out, _ = run(
        "simulate", str(chat_file), "--capacity-blocks", "100", "--page-size", "4", "--host-capacity-blocks", "200"
    )
    assert code == 0
    assert "hits per tier" in out and "modelled TTFT" in out and "device only" in out and "lru + host" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--write-policy", "write_back"], "only for tiers"),
        (["--prefill-ms-per-token", "1"], "only for tiers"),
        (["--disk-capacity-blocks", "10", "--write-policy", "write_back"], "--host-capacity-blocks"),
        (["--host-capacity-blocks", "10", "--host-load-ms-per-page", "-1"], "--host-load-ms-per-page"),
        (["--host-capacity-blocks", "10", "--disk-load-ms-per-page", "nan"], "finite"),
        (["--host-capacity-blocks", "0"], "--host-capacity-blocks"),
        (["--host-capacity-blocks", "10", "--write-policy", "nope"], "--write-policy"),
    ],
)
def test_cli_rejects_bad_tier_flags(chat_file: Path, args: list[str], message: str) -> None:
    code, out, err = run("simulate", str(chat_file), "--capacity-blocks", "100", *args)
    assert code != 0 and out == "" and message in err


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_device_hits_refresh_the_tiers_copies_as_the_engine_does(tier: str) -> None:
    """Regression: the simulated host and disk tiers' LRUs saw no device hit (the engine's do: a device hit
    refreshes the copies below it, the run's head last), so the system prompt (1, 2) every request hit on the
    device was what a full tier evicted first. Device 3 blocks, tier 5, write-through, runs stored tail first.
    Host: (1,2,3) stores [3,2,1] (oldest first); (1,2,4): the device evicts 3, whose host copy is refreshed
    ([2,1,3]), the hit on (1,2) refreshes it ([3,2,1]), 4 is stored ([3,2,1,4]); (1,2,5) gives [3,4,2,1,5];
    (1,2,6) evicts 3: [4,5,2,1,6]; (7,8) takes the device (6 and 2 refreshed: [4,5,1,6,2]) and stores 8, 7 over
    4, 5. (1,2,9) then finds 1 on the device and 2 on the host. The disk (no refresh on device evictions):
    [3,2,1], [3,2,1,4], [3,4,2,1,5], [4,5,2,1,6], [2,1,6,8,7]: 2 on the disk. Without the refresh page 2 went
    before pages stored after it, and the last request missed it."""
    w = hashes((1, 2, 3), (1, 2, 4), (1, 2, 5), (1, 2, 6), (7, 8), (1, 2, 9))
    r = tiered(w, 3, 5 if tier == "host" else None, 5 if tier == "disk" else None)
    assert r.tiers.hit_tokens == {"device": 7 * BLOCK, tier: BLOCK}
    assert r.tiers.loaded_blocks == {tier: 1}
    assert r.hit_tokens == simulate(w, 3).hit_tokens + BLOCK  # the device's hits are the device alone's


def _strict(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("extra", [["--host-capacity-blocks", "200"], ["--replicas", "2"]])
def test_cli_costs_past_max_cost_ms_are_refused_and_the_dearest_keeps_the_json_finite(
    chat_file: Path, extra: list[str]
) -> None:
    """1e308 ms a token made every modelled TTFT inf: Infinity in --json, and every replica's load alike."""
    args = ["simulate", str(chat_file), "--capacity-blocks", "100", "--page-size", "4", "--json", *extra]
    code, _, err = run(*args, "--prefill-ms-per-token", "1e308")
    assert code == 2 and "--prefill-ms-per-token" in err
    code, out, err = run(*args, "--prefill-ms-per-token", "1e9")
    assert code == 0, err
    report = _strict(out)
    assert 0 < report["ttft_mean_s"] < math.inf


def test_json_writes_a_figure_past_the_doubles_as_null(capsys) -> None:
    print_json({"ttft_mean_s": math.inf, "runs": [{"x": math.nan, "n": 3}]})
    assert _strict(capsys.readouterr().out) == {"ttft_mean_s": None, "runs": [{"x": None, "n": 3}]}
