"""Belady against an exhaustive search of the replay's own model: every eviction choice, with recorded outputs,
partial last pages and requests larger than the cache. It is the optimum one request at a time, and only then: with
requests in flight an online policy can beat it (docs/simulator.md, "Policies and the bounds")."""

from __future__ import annotations

import json
import random
from functools import cache
from itertools import combinations

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.sim.simulation import simulate
from radixcache.trace import write_token_jsonl
from radixcache.trace.records import TokenRequest
from radixcache.trace.workload import token_workload
from tests.sim.conftest import write_overlapping_recorded_trace

Pages = frozenset[tuple[int, ...]]


def optimum(requests: list[TokenRequest], p: int, capacity: int, concurrency: int) -> int:
    """The most prompt pages any eviction schedule hits, in CacheReplay's model: a request matches its prompt's
    whole pages, locks them, holds blocks for the rest of prompt and output (cut to what the cache can free), and
    when `concurrency` later requests have arrived (or the trace ends) its whole pages join the tree."""
    reqs = [(r.tokens, r.tokens + (r.output_tokens or ())) for r in requests]

    def pages(tokens: tuple[int, ...]) -> list[tuple[int, ...]]:
        return [tokens[: (i + 1) * p] for i in range(len(tokens) // p)]

    @cache
    def best(i: int, tree: Pages, running: tuple) -> int:
        cached, flying = set(tree), list(running)
        while flying and (len(flying) >= concurrency or i == len(reqs)):
            cached.update(pages(flying.pop(0)[0]))
        if i == len(reqs):
            return 0
        prompt, full = reqs[i]
        hit = 0
        while hit < len(prompt) // p and pages(prompt)[hit] in cached:
            hit += 1
        locked = {page for tokens, matched, _ in [*flying, (prompt, hit, 0)] for page in pages(tokens)[:matched]}
        free = capacity - len(cached) - sum(held for _, _, held in flying)
        evictable = sorted(cached - locked)
        need = -(-len(full) // p) - hit
        if need > free + len(evictable):  # too large: it caches the whole pages that fit
            need = free + len(evictable)
            full = full[: (hit + need) * p]
        choices = [frozenset(cached)] if need <= free else []
        for gone in combinations(evictable, max(0, need - free)) if need > free else ():
            kept = cached - set(gone)
            if all(len(page) == p or page[:-p] in kept for page in kept):  # what stays is closed under prefixes
                choices.append(frozenset(kept))
        return hit + max(best(i + 1, kept, (*flying, (full, hit, need))) for kept in choices)

    return best(0, frozenset(), ())


def random_requests(rng: random.Random) -> list[TokenRequest]:
    requests: list[TokenRequest] = []
    seen: list[tuple[int, ...]] = [()]
    for i in range(rng.randint(3, 7)):
        base = rng.choice(seen)
        tokens = base[: rng.randint(0, len(base))] + tuple(rng.randrange(2) for _ in range(rng.randint(0, 4)))
        tokens = tokens or (rng.randrange(2),)
        output = tuple(rng.randrange(2) for _ in range(rng.randint(0, 2))) or None
        requests.append(TokenRequest(float(i), tokens, len(output or ()), output_tokens=output))
        seen.append(tokens + (output or ()))
    return requests


@pytest.mark.parametrize("seed", range(40))
def test_belady_one_request_at_a_time_is_the_optimum(seed: int) -> None:
    rng = random.Random(seed)
    p, capacity, requests = rng.randint(1, 2), rng.randint(1, 6), random_requests(rng)
    assert simulate(token_workload(requests, p), capacity, "belady").hit_blocks == optimum(requests, p, capacity, 1)


def _beaten() -> list[TokenRequest]:
    """The trace on which LFU beats Belady at concurrency 2 (the test below works it through)."""
    data = [
        ((1, 0), (0, 1, 1)),
        ((0, 1, 1, 2), (2, 1)),
        ((1, 0, 1, 2, 0), None),
        ((1, 2, 1, 2, 0, 1, 2), None),
        ((1, 2, 2, 2, 0), (0, 2, 0)),
        ((0, 1, 2), (0, 2)),
        ((1, 0, 1, 2, 1, 1, 2, 0, 2), None),
        ((1, 0, 1, 2, 0, 1, 2, 2, 0), (1,)),
    ]
    return [TokenRequest(float(i), t, len(o or ()), output_tokens=o) for i, (t, o) in enumerate(data)]


def test_the_cli_calls_belady_no_bound_with_requests_in_flight(tmp_path) -> None:
    """Regression: under --concurrency 2 the CLI labelled Belady "bound: Belady, resident" while LFU beat it on
    this trace. Above 1 it is labelled a heuristic, with a note; at 1 it stays the bound."""
    path = tmp_path / "beaten.jsonl"
    write_token_jsonl(path, _beaten())
    common = [str(path), "--capacity-blocks", "9", "--page-size", "2"]

    def invoke(*args: str) -> str:
        result = CliRunner().invoke(main, ["simulate", *common, *args])
        assert result.exit_code == 0, result.output
        return result.stdout

    runs = json.loads(invoke("--policies", "lfu", "--concurrency", "2", "--json"))["runs"]
    by_name = {run["name"]: run for run in runs}
    assert by_name["lfu"]["hit_tokens"] > by_name["belady"]["hit_tokens"]  # beaten: it is no bound here
    assert not by_name["belady"]["label"].startswith("bound") and "not a bound" in by_name["belady"]["label"]
    report = json.loads(invoke("--policy", "lfu", "--belady", "--concurrency", "2", "--json"))
    assert "not a bound" in report["bounds"]["belady"]
    table = invoke("--policy", "lfu", "--belady", "--concurrency", "2")
    assert "(bound)" not in table and "can beat it" in table
    alone = json.loads(invoke("--policies", "lfu", "--json"))["runs"]
    assert {run["name"]: run["label"] for run in alone}["belady"] == "bound: Belady, resident"


def test_with_requests_in_flight_an_online_policy_can_beat_belady() -> None:
    """At concurrency 2 a request's pages join the tree only when it finishes. Before request 4, Belady keeps page
    (0, 1) (next read by request 5) over (1, 0) (read by requests 6 and 7); LFU keeps (1, 0). Request 6 computes
    (1, 0) again, but request 7 arrives before it finishes and misses too: 2 blocks for Belady, 3 for LFU (the
    optimum). One at a time Belady hits 7, the optimum there."""
    requests = _beaten()
    workload = token_workload(requests, 2)

    def hits(policy: str, concurrency: int) -> int:
        return simulate(workload, 9, policy, concurrency=concurrency).hit_blocks

    assert hits("belady", 1) == optimum(requests, 2, 9, 1) == 7
    assert hits("belady", 2) == 2 < hits("lfu", 2) == optimum(requests, 2, 9, 2) == 3


@pytest.mark.parametrize(("finish", "in_flight"), [(0.5, False), (1.5, True)])
def test_a_recorded_trace_whose_requests_overlap_labels_belady_no_bound(tmp_path, finish, in_flight) -> None:
    """Regression: at --concurrency 1 a recorded trace's finish times still put requests in flight together (each
    finishing after the next arrived), where Belady is no bound (docs/simulator.md), and the CLI labelled it one.
    Finishing before the next arrival it is one request at a time, and the bound."""
    path = write_overlapping_recorded_trace(tmp_path / "recorded.jsonl", finish)
    common = ["simulate", str(path), "--capacity-blocks", "8", "--block-size", "4", "--json"]
    runs = json.loads(CliRunner().invoke(main, [*common, "--policies", "lru"]).stdout)["runs"]
    label = {run["name"]: run["label"] for run in runs}["belady"]
    report = json.loads(CliRunner().invoke(main, [*common, "--belady"]).stdout)
    assert ("not a bound" in label) is in_flight and ("not a bound" in report["bounds"]["belady"]) is in_flight
    assert label.startswith("bound") is not in_flight
