"""Admission in the simulator: the two Belady bounds, admission policies in a replay, and `simulate --policies`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.errors import PolicyError, RadixCacheError
from radixcache.policy.admission import AdmissionPolicy, AdmissionRequest, ReuseAdmission
from radixcache.policy.reuse import ReusePolicy
from radixcache.sim.compare import compare
from radixcache.sim.evaluation import evaluate
from radixcache.sim.results import BELADY, BELADY_ADMISSION
from radixcache.sim.simulation import simulate, simulate_infinite
from radixcache.trace.synthetic import multi_turn_chat, rag
from radixcache.trace.workload import SimRequest, Workload, token_workload


def _workload(*prompts: list[int]) -> Workload:
    requests = tuple(SimRequest(float(i), tuple(p), (), len(p)) for i, p in enumerate(prompts))
    return Workload(requests, 1, 1, "token")


def test_the_admission_bound_lets_a_dead_request_skip_the_cache() -> None:
    """Capacity 3. [1, 2], then [3, 4, 5] (never read again), then [1, 2]. Resident, the middle request must hold
    all three blocks, so [1, 2] is gone by the third request: 0 of 7 tokens hit. With admission, its pages are
    computed and dropped, and [1, 2] stays: 2 of 7."""
    w = _workload([1, 2], [3, 4, 5], [1, 2])
    resident = simulate(w, 3, BELADY, check=True)
    admitted = simulate(w, 3, BELADY_ADMISSION, check=True)
    assert (resident.hit_tokens, admitted.hit_tokens) == (0, 2)
    assert admitted.policy == BELADY_ADMISSION and resident.policy == BELADY


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("capacity", [40, 150])
def test_bounds_are_ordered_lru_resident_admission_infinite(seed: int, capacity: int) -> None:
    w = token_workload(multi_turn_chat(conversations=15, seed=seed), page_size=4)
    lru = simulate(w, capacity, "lru").hit_rate
    resident = simulate(w, capacity, BELADY, check=True).hit_rate
    admitted = simulate(w, capacity, BELADY_ADMISSION, check=True).hit_rate
    infinite = simulate_infinite(w).hit_rate
    assert lru <= resident + 1e-12 <= admitted + 2e-12 <= infinite + 3e-12


def test_the_admission_bound_holds_with_requests_in_flight() -> None:
    w = token_workload(rag(queries=60, documents=12, seed=4), page_size=8)
    for concurrency in (1, 3):
        resident = simulate(w, 120, BELADY, concurrency=concurrency, check=True).hit_rate
        admitted = simulate(w, 120, BELADY_ADMISSION, concurrency=concurrency, check=True).hit_rate
        assert resident <= admitted + 1e-12


class _DeclineAll(AdmissionPolicy):
    name = "decline-all"

    def decide(self, request: AdmissionRequest) -> int:
        return 0


def test_an_admission_policy_that_declines_everything_caches_nothing_and_keeps_the_invariants() -> None:
    w = token_workload(multi_turn_chat(conversations=8, seed=5), page_size=4)
    result = simulate(w, 200, "lru", admission=_DeclineAll(), concurrency=2, check=True)
    assert result.hit_tokens == 0 and result.evicted_blocks == 0
    assert result.admission == "decline-all" and result.declined_pages > 0
    everything = simulate(w, 200, "lru", admission="all", check=True)
    assert everything.hit_tokens == simulate(w, 200, "lru").hit_tokens and everything.declined_pages == 0


def test_reuse_admission_in_a_replay_keeps_the_invariants_and_reports_its_bound() -> None:
    w = token_workload(rag(queries=200, documents=40, seed=6), page_size=16)
    report = evaluate(w, 150, "reuse", admission="reuse", belady=True, belady_admission=True)
    out = report.as_dict()
    assert out["admission"] == "reuse" and out["belady_admission_hit_rate"] >= out["belady_hit_rate"] - 1e-12
    assert set(out["bounds"]) == {BELADY, BELADY_ADMISSION}
    assert simulate(w, 150, "reuse", admission="reuse", check=True).hit_rate == out["hit_rate"]
    with pytest.raises(RadixCacheError, match="offline bound"):
        simulate(w, 150, BELADY, admission="all")


def test_compare_gives_every_policy_and_both_bounds() -> None:
    w = token_workload(multi_turn_chat(conversations=10, seed=7), page_size=4)
    rows = compare(w, 100, ["lru", "reuse"], admission="reuse")
    names = [row.name for row in rows]
    assert names == ["lru", "reuse", "reuse + admission reuse", BELADY, BELADY_ADMISSION, "infinite"]
    by_name = {row.name: row.result.hit_rate for row in rows}
    assert by_name["lru"] == simulate(w, 100, "lru").hit_rate
    assert by_name[BELADY] == simulate(w, 100, BELADY).hit_rate
    assert by_name[BELADY] <= by_name[BELADY_ADMISSION] + 1e-12 <= by_name["infinite"] + 2e-12


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def chat(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    code, out, err = _run("trace", "gen", "chat", str(path), "--count", "15", "--set", "turns=2,4")
    assert code == 0, out + err
    return path


def test_simulate_policies_all_prints_every_policy_and_both_bounds_labelled(chat: Path) -> None:
    code, out, _ = _run("simulate", str(chat), "--capacity-blocks", "200", "--page-size", "4", "--policies", "all")
    assert code == 0, out
    for name in ("lru", "lfu", "fifo", "slru", "cost", "reuse", "belady", "belady-admission", "infinite"):
        assert name in out
    assert "resident" in out and "admission" in out
    code, out, _ = _run(
        "simulate", str(chat), "--capacity-blocks", "200", "--page-size", "4", "--policies", "lru,reuse", "--json"
    )
    assert code == 0, out
    runs = json.loads(out)["runs"]
    assert [r["name"] for r in runs] == ["lru", "reuse", "belady", "belady-admission", "infinite"]
    assert [r["kind"] for r in runs] == ["policy", "policy", "bound", "bound", "infinite"]


def test_simulate_admission_flags_and_their_errors(chat: Path) -> None:
    base = ("simulate", str(chat), "--capacity-blocks", "200", "--page-size", "4")
    code, out, _ = _run(*base, "--policy", "reuse", "--admission", "reuse", "--belady", "--belady-admission", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["admission"] == "reuse" and "belady_admission_hit_rate" in report and "belady_hit_rate" in report
    code, _, err = _run(*base, "--admission", "reuse")
    assert code == 2 and "--policy reuse" in err
    code, _, err = _run(*base, "--policies", "lru,nope")
    assert code == 2 and "nope" in err  # a usage error, as --policy's own
    code, _, err = _run(*base, "--policies", "all", "--belady")
    assert code == 2 and "already includes" in err


def test_a_synthetic_trace_can_be_swept_at_a_held_out_seed() -> None:
    from radixcache.sim.sweep import load_trace

    name, held_out = load_trace("synthetic:chat@1", 16, 512)
    _, default = load_trace("synthetic:chat", 16, 512)
    assert name == "chat@1" and held_out.requests != default.requests
    assert load_trace("synthetic:chat@0", 16, 512)[1].requests == default.requests
    with pytest.raises(RadixCacheError, match="seed"):
        load_trace("synthetic:chat@x", 16, 512)


def test_a_recorded_request_holds_the_page_it_was_writing_while_it_runs(tmp_path: Path) -> None:
    """Pages of 4 tokens, a pool of 4. A: 8 prompt tokens (ids 1, 2), 6 generated, 13 written (all but the last
    generated), so one output page (3): it looks up page 1, inserts 1, 2, 3, and holds a fourth block for its partial
    page while it runs. B: 12 tokens (1, 2, 5) and 2 generated, 13 written, hits 1, 2 and needs page 5 plus its own
    partial page: two blocks, one free, so page 3 is evicted. An engine does the same."""
    from radixcache.trace.workload import load_workload

    lines = [
        {"timestamp": 0, "input_length": 8, "output_length": 6, "hash_ids": [1, 2], "output_hash_ids": [3]},
        {"timestamp": 1, "input_length": 12, "output_length": 2, "hash_ids": [1, 2, 5], "output_hash_ids": []},
    ]
    path = tmp_path / "recorded.jsonl"
    path.write_text("".join(json.dumps({**line, "block_size": 4}) + "\n" for line in lines))
    workload = load_workload(str(path))
    assert all(r.holds_tail for r in workload.requests)
    result = simulate(workload, 4, "lru", check=True)
    assert (result.hit_tokens, result.evicted_blocks) == (8, 1)
    assert simulate(workload, 5, "lru", check=True).evicted_blocks == 0


def test_the_admission_bound_counts_the_next_requests_own_reads() -> None:
    """Capacity 3: [5, 6], [1, 2, 3], [1, 2, 3]. When the second request finishes, five pages are cached and the
    bound keeps the three read soonest: [1, 2, 3], which the third request reads. Trimmed after the oracle's clock
    had moved on to the third request, its reads would not count: every page would look dead, and the deepest (3)
    would go first, leaving the third request a hit of 2."""
    w = _workload([5, 6], [1, 2, 3], [1, 2, 3])
    assert simulate(w, 3, BELADY_ADMISSION, check=True).hit_tokens == 3


def test_a_reuse_admission_object_must_learn_from_the_caches_own_policy() -> None:
    """Regression: ReuseAdmission(ReusePolicy(), threshold=...) beside policy 'reuse' learned from a policy no cache
    told of any hit or eviction (mean rate 0), so it admitted every page while the result said admission 'reuse'.
    Built on the policy object the cache evicts with, it declines pages; built on another, it is refused."""
    w = token_workload(rag(queries=200, documents=12, seed=4), page_size=8)
    policy = ReusePolicy()
    assert simulate(w, 120, policy, admission=ReuseAdmission(policy, threshold=0.5)).declined_pages > 0
    for other in ("reuse", ReusePolicy(), "lru"):
        with pytest.raises(PolicyError, match="a ReuseAdmission learns from the cache's own ReusePolicy"):
            simulate(w, 120, other, admission=ReuseAdmission(ReusePolicy(), threshold=0.5))


class _EveryOther(AdmissionPolicy):
    """Stateful: admits every page of one request in two, counting the requests it has seen."""

    name = "every-other"

    def __init__(self) -> None:
        self.seen = 0

    def decide(self, request: AdmissionRequest) -> int:
        self.seen += 1
        return request.total_pages if self.seen % 2 else 0


def test_compare_gives_each_policy_its_own_admission_object() -> None:
    """Regression: one admission object was shared by every policy's replay, so its count ran over all of them
    together and a row was not that policy's alone. Each row must equal the policy simulated on its own."""
    w = token_workload(multi_turn_chat(conversations=10, seed=7), page_size=4)
    given = _EveryOther()
    rows = {row.name: row.result for row in compare(w, 100, ["lru", "fifo"], admission=given, bounds=())}
    for name in ("lru", "fifo"):
        alone = simulate(w, 100, name, admission=_EveryOther())
        row = rows[f"{name} + admission every-other"]
        assert (row.hit_tokens, row.declined_pages) == (alone.hit_tokens, alone.declined_pages)
    assert given.seen == 0  # the caller's object stays as it was given


def test_admission_names_are_taken_in_any_case(chat: Path) -> None:
    """Regression: --admission refused 'Reuse' (click's case-sensitive choice), and compare() ran 'REUSE' beside
    every policy, where it failed, while make_admission and --policy take any case. Each gives the lower-case run."""
    w = token_workload(multi_turn_chat(conversations=10, seed=7), page_size=4)
    lower, upper = (compare(w, 100, ["lru", "reuse"], admission=name, bounds=()) for name in ("reuse", "REUSE"))
    assert [(r.name, r.result.hit_tokens) for r in upper] == [(r.name, r.result.hit_tokens) for r in lower]
    args = ["simulate", str(chat), "--capacity-blocks", "200", "--page-size", "4", "--policy", "reuse", "--json"]
    figures = []
    for name in ("reuse", "Reuse"):
        code, out, err = _run(*args, "--admission", name)
        assert code == 0, err
        report = json.loads(out)
        figures.append((report["admission"], report["hit_tokens"], report["declined_pages"]))
    assert figures[0] == figures[1]


def test_compare_takes_policy_names_in_any_case() -> None:
    """Regression: compare(["REUSE"], admission="reuse") silently left out the reuse admission row (the name was
    compared with "reuse" as given), though make_policy took the name. Any case gives the lower-case rows."""
    w = token_workload(multi_turn_chat(conversations=10, seed=7), page_size=4)
    lower, mixed = (
        compare(w, 100, names, admission="reuse", bounds=()) for names in (["reuse", "lru"], ["REUSE", "Lru"])
    )
    assert [(r.name, r.result.hit_tokens) for r in mixed] == [(r.name, r.result.hit_tokens) for r in lower]
    assert "reuse + admission reuse" in [r.name for r in mixed]


def test_compare_refuses_one_string_for_its_lists_of_names() -> None:
    """compare(w, 100, "lru") took the string's letters for names ("unknown eviction policy 'l'"), and
    bounds="belady" compared bound 'b'; a list of one name is what it means."""
    w = _workload([1, 2], [1, 2, 3], [1, 2])
    with pytest.raises(RadixCacheError, match="policies must be a list of names, got the string 'lru'"):
        compare(w, 3, "lru")
    with pytest.raises(RadixCacheError, match="bounds must be a list of names, got the string 'belady'"):
        compare(w, 3, ["lru"], bounds="belady")
    rows = compare(w, 3, ["lru"], bounds=["belady"])
    assert [(r.name, r.result.hit_tokens) for r in rows] == [("lru", 4), ("belady", 4), ("infinite", 4)]


@pytest.mark.parametrize("policy", ["lru", BELADY, BELADY_ADMISSION, "lru-dead"])
@pytest.mark.parametrize("capacity", [0, -3, True, 2.0, "5", None])
def test_every_replay_refuses_a_capacity_that_is_no_positive_int(policy: str, capacity: object) -> None:
    """The admission bound runs a tree larger than its capacity, so a capacity of 0, -3 or True replayed (caching
    nothing, or one block) where every other policy refused it, and "5" or None was a TypeError from its oracle."""
    w = _workload([1, 2], [1, 2, 3], [1, 2])
    with pytest.raises(RadixCacheError, match=f"capacity_blocks must be a positive int, got {capacity!r}"):
        simulate(w, capacity, policy)  # type: ignore[arg-type]
    assert simulate(w, 3, policy).hit_tokens == 4  # [1, 2] twice, by hand
