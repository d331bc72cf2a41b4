"""The `simulate` and `trace` commands: results, JSON keys, and one clear error line with a non-zero exit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.trace import iter_token_jsonl, write_token_jsonl
from radixcache.trace.records import TokenRequest


@pytest.fixture
def chat(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    result = CliRunner().invoke(main, ["trace", "gen", "chat", str(path), "--count", "20", "--set", "turns=2,4"])
    assert result.exit_code == 0, result.output
    return path


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_simulate_json_has_the_documented_keys(chat: Path) -> None:
    code, out, _ = run("simulate", str(chat), "--capacity-blocks", "300", "--page-size", "4", "--belady", "--json")
    assert code == 0
    report = json.loads(out)
    for key in ("hit_rate", "hit_tokens", "prompt_tokens", "requests", "evicted_blocks", "infinite_hit_rate"):
        assert key in report
    assert report["hit_rate"] <= report["belady_hit_rate"] <= report["infinite_hit_rate"]


def test_simulate_table_and_capacity_in_tokens(chat: Path) -> None:
    code, out, _ = run("simulate", str(chat), "--capacity-tokens", "1200", "--page-size", "4", "--policy", "slru")
    assert code == 0
    assert "slru" in out and "infinite" in out and "300 blocks" in out


@pytest.mark.parametrize(
    "args",
    [
        ["--capacity-blocks", "10", "--capacity-tokens", "10"],
        [],
        ["--capacity-blocks", "0"],
        ["--capacity-blocks", "10", "--policy", "nope"],
    ],
)
def test_simulate_rejects_bad_options(chat: Path, args: list[str]) -> None:
    code, _, err = run("simulate", str(chat), *args)
    assert code != 0 and err.strip()


def test_malformed_trace_gives_one_line_naming_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "tokens": [1], "output_length": 0}\n{"timestamp": 1, "tokens": "abc"}\n')
    code, out, err = run("simulate", str(path), "--capacity-blocks", "8")
    assert code == 1 and out == ""
    assert err.count("\n") == 1
    assert "bad.jsonl:2: field 'tokens'" in err


def test_text_traces_cannot_be_simulated_without_a_tokenizer(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "turns": [{"user": "hi"}]}\n')
    code, _, err = run("simulate", str(path), "--capacity-blocks", "8")
    assert code == 1 and "text trace" in err


def test_page_size_on_a_hash_trace_must_be_the_block_size(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n')
    code, _, err = run("simulate", str(path), "--capacity-blocks", "8", "--page-size", "16")
    assert code == 1 and "--block-size" in err
    assert run("simulate", str(path), "--capacity-blocks", "8", "--block-size", "16")[0] == 0


def test_block_size_on_a_token_trace_is_refused_not_ignored(tmp_path: Path) -> None:
    """`--block-size 16` on a token trace was ignored: its pages stayed one token (a 64-block cache held 64 tokens,
    not 1,024), with no word of it. A token trace's page is --page-size, as a hash trace's is --block-size."""
    path = tmp_path / "t.jsonl"
    write_token_jsonl(path, [TokenRequest(0, tuple(range(40)), 2), TokenRequest(1, tuple(range(40)), 2)])
    code, out, err = run("simulate", str(path), "--capacity-blocks", "64", "--block-size", "16")
    assert (code, out) == (2, "") and "--block-size is for hash-block traces" in err and "--page-size 16" in err
    code, out, _ = run("simulate", str(path), "--capacity-blocks", "64", "--page-size", "16", "--json")
    assert code == 0 and json.loads(out)["hit_tokens"] == 32  # the second prompt's two whole pages


def test_an_empty_policies_list_is_refused_not_ignored(chat: Path) -> None:
    """`--policies ""` (say, an unset shell variable) was taken as no --policies: one lru run, no word of it."""
    code, out, err = run("simulate", str(chat), "--capacity-blocks", "300", "--page-size", "4", "--policies", "")
    assert (code, out) == (2, "") and "--policies" in err


@pytest.mark.parametrize("leases", [[], ["--leases"]])
def test_an_unknown_policy_is_a_usage_error_with_leases_or_without(chat: Path, leases: list[str]) -> None:
    """`--policies belady` exited 1 (after reading the trace) without --leases and 2 with: a bad option value is a
    usage error (exit 2, as click's own), both ways."""
    args = ("simulate", str(chat), "--capacity-blocks", "300", "--page-size", "4", "--policies", "belady", *leases)
    code, out, err = run(*args)
    assert (code, out) == (2, "") and "unknown policy 'belady'" in err


@pytest.mark.parametrize(
    ("src", "args"),
    [
        ('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n', []),
        ('{"id": "a", "turns": [{"user": "hi"}]}\n', []),
        ('{"timestamp": 0, "tokens": [1], "output_length": 1}\n', ["--to", "token-jsonl"]),
    ],
)
def test_trace_convert_refuses_to_write_json_lines_under_a_msgpack_name(tmp_path: Path, src: str, args) -> None:
    """A hash or text trace converted to `out.msgpack` was written as JSON lines under that name, which every reader
    then took for a msgpack stream: `record 0 (byte 0): expected a JSON object, got int`."""
    (tmp_path / "in.jsonl").write_text(src)
    code, _, err = run("trace", "convert", str(tmp_path / "in.jsonl"), str(tmp_path / "out.msgpack"), *args)
    assert code == 1 and "give DST a .jsonl name" in err and not (tmp_path / "out.msgpack").exists()


@pytest.mark.parametrize(
    ("text", "option", "kind"),
    [
        ('{"timestamp": 0, "tokens": [1, 2], "output_length": 1}\n', "--block-size", "token"),
        ('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n', "--page-size", "hash"),
        ('{"id": "a", "turns": [{"user": "hi"}]}\n', "--page-size", "text"),
    ],
)
def test_trace_stats_refuses_a_page_option_the_trace_does_not_use(tmp_path: Path, text: str, option: str, kind) -> None:
    """`trace stats tokens.jsonl --block-size 4` counted reuse in pages of --page-size (16 by default), ignoring the
    option without a word; a hash trace ignored --page-size, a text trace both."""
    (tmp_path / "t.jsonl").write_text(text)
    code, out, err = run("trace", "stats", str(tmp_path / "t.jsonl"), option, "4")
    assert (code, out) == (2, "") and f"{option} does not apply to a {kind} trace" in err


def test_trace_convert_round_trips_and_stats_reports_reuse(chat: Path, tmp_path: Path) -> None:
    assert run("trace", "convert", str(chat), str(tmp_path / "c.msgpack"))[0] == 0
    assert run("trace", "convert", str(tmp_path / "c.msgpack"), str(tmp_path / "back.jsonl"))[0] == 0
    assert (tmp_path / "back.jsonl").read_bytes() == chat.read_bytes()
    code, out, _ = run("trace", "stats", str(tmp_path / "c.msgpack"), "--json")
    stats = json.loads(out)
    assert code == 0 and stats["sessions"] == 20 and 0 < stats["infinite_hit_rate"] < 1


def test_trace_convert_refuses_a_kind_change(chat: Path, tmp_path: Path) -> None:
    code, _, err = run("trace", "convert", str(chat), str(tmp_path / "m.jsonl"), "--to", "mooncake")
    assert code == 1 and "cannot convert" in err


def test_a_failed_trace_convert_leaves_the_file_it_would_write_as_it_was(chat: Path, tmp_path: Path) -> None:
    """A convert that failed on a record (here one msgpack cannot hold) had written the records before it: DST read
    as a sound, shorter trace, and an earlier DST was gone. DST changes only when the whole trace is written."""
    source = tmp_path / "late.jsonl"
    write_token_jsonl(source, [TokenRequest(0, (1, 2), 1), TokenRequest(2**64, (1, 2, 3), 1)])
    earlier = tmp_path / "earlier.msgpack"
    assert run("trace", "convert", str(chat), str(earlier))[0] == 0
    before = earlier.read_bytes()
    for dst in (earlier, tmp_path / "new.msgpack"):
        code, _, err = run("trace", "convert", str(source), str(dst))
        assert code == 1 and f"{dst}: request 1: field 'timestamp'" in err, err
    assert earlier.read_bytes() == before and not (tmp_path / "new.msgpack").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl", "earlier.msgpack", "late.jsonl"]
    assert run("trace", "convert", str(chat), str(earlier))[0] == 0 and earlier.read_bytes() == before
    assert run("trace", "convert", str(chat), os.devnull)[0] == 0  # no regular file: written directly


def test_trace_convert_writes_a_dst_whose_name_is_near_the_file_systems_limit(chat: Path, tmp_path: Path) -> None:
    """The hidden file DST is written through is `.DST.<pid>.partial`, past 255 bytes for a DST of 240 or so (which
    the file system takes, and a convert before the hidden file wrote): 'DST: File name too long'."""
    dst = tmp_path / ("t" * 240 + ".msgpack")
    code, _, err = run("trace", "convert", str(chat), str(dst))
    assert code == 0, err
    assert run("trace", "convert", str(dst), str(tmp_path / "back.jsonl"))[0] == 0
    assert (tmp_path / "back.jsonl").read_text() == chat.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back.jsonl", "chat.jsonl", dst.name]


@pytest.mark.skipif(os.name == "nt", reason="POSIX file modes and folder fsyncs")
def test_trace_gen_syncs_dst_keeps_its_mode_and_removes_a_killed_runs_leftover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trace gen` onto an earlier 0600 DST made it 0644 (the hidden file's default mode), renamed it into place
    unsynced (a power cut could leave DST empty: a trace that reads as sound, with no request), and a run killed
    mid-write (kill -9) left its hidden `.DST.<pid>.partial` for good. Now DST keeps its mode, the file is fsynced
    before its rename and the folder after, and a leftover whose process is dead goes with the next write of DST."""
    dst = tmp_path / "agents.jsonl"
    dst.write_text("")
    dst.chmod(0o600)
    dead = 4_194_399  # past Linux's largest pid_max: no process has it
    for leftover in (f".agents.jsonl.{dead}.partial", f".agents.jsonl.{dead}-0123abcd.partial"):
        (tmp_path / leftover).write_text('{"half": ')
    real_fsync = os.fsync
    synced: list[tuple[int, bytes]] = []  # (the descriptor's inode, what DST held then)

    def watching(fd: int) -> None:
        synced.append((os.fstat(fd).st_ino, dst.read_bytes()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", watching)
    assert run("trace", "gen", "agent", str(dst), "--count", "2")[0] == 0
    assert (dst.stat().st_mode & 0o777) == 0o600 and dst.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["agents.jsonl"]
    assert synced == [(dst.stat().st_ino, b""), (tmp_path.stat().st_ino, dst.read_bytes())]


@pytest.mark.parametrize("kind", ["chat", "agent", "rag", "few-shot"])
def test_trace_gen_is_seeded(tmp_path: Path, kind: str) -> None:
    for name in ("a.jsonl", "b.jsonl"):
        assert run("trace", "gen", kind, str(tmp_path / name), "--count", "3", "--seed", "7")[0] == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_trace_gen_rejects_unknown_parameters(tmp_path: Path) -> None:
    code, _, err = run("trace", "gen", "rag", str(tmp_path / "r.jsonl"), "--set", "nope=1")
    assert code != 0 and "nope" in err


def test_every_command_help_has_an_example() -> None:
    for args in (["simulate"], ["trace"], ["trace", "stats"], ["trace", "convert"], ["trace", "gen"]):
        code, out, _ = run(*args, "--help")
        assert code == 0 and "Example:" in out, args


def test_truncated_msgpack_exits_non_zero(tmp_path: Path) -> None:
    write_token_jsonl(tmp_path / "t.jsonl", [TokenRequest(0, (1, 2), 0), TokenRequest(1, (1, 2), 0)])
    run("trace", "convert", str(tmp_path / "t.jsonl"), str(tmp_path / "t.msgpack"))
    data = (tmp_path / "t.msgpack").read_bytes()
    (tmp_path / "t.msgpack").write_bytes(data[:-1])
    code, _, err = run("trace", "stats", str(tmp_path / "t.msgpack"))
    assert code == 1 and "truncated" in err
    assert len(list(iter_token_jsonl(tmp_path / "t.jsonl"))) == 2


@pytest.mark.parametrize(
    "args",
    [
        ["--capacity-blocks", str(10**23)],
        ["--capacity-tokens", str(10**26)],
        ["--capacity-blocks", "300", "--host-capacity-blocks", str(2**63)],
        ["--capacity-blocks", "300", "--disk-capacity-blocks", str(2**63)],
    ],
)
def test_a_size_past_int64_is_a_usage_error(chat: Path, args: list[str]) -> None:
    """Block ids and the replays' counters are int64: a larger size was an internal OverflowError."""
    code, _, err = run("simulate", str(chat), *args)
    assert code == 2 and args[-2] in err and "9223372036854775807" in err and "internal" not in err


@pytest.mark.parametrize(("option", "most"), [("--windows", "100000"), ("--replicas", "4096")])
def test_a_count_past_what_the_simulator_holds_is_a_usage_error(chat: Path, option: str, most: str) -> None:
    """--windows or --replicas of 1e20 was an internal MemoryError once the run had started."""
    code, _, err = run("simulate", str(chat), option, "100000000000000000000")
    assert code == 2 and option in err and most in err and "internal" not in err


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--seed", "5"], "--seed"),
        (["--policies", "all", "--windows", "5"], "--windows"),
        (["--policies", "lru,slru", "--policy", "fifo"], "--policy"),
        (["--replicas", "2", "--windows", "5"], "--windows"),
        (["--replicas", "2", "--no-infinite"], "--no-infinite"),
        (["--replicas", "2", "--read-ahead"], "--read-ahead/--no-read-ahead"),
        (["--in-memory", "--read-ahead"], "--read-ahead/--no-read-ahead"),
        (["--in-memory", "--no-read-ahead"], "--read-ahead/--no-read-ahead"),
    ],
)
def test_an_option_the_run_would_not_use_is_refused(chat: Path, args: list[str], option: str) -> None:
    """These were ignored without a word: --seed without --replicas, --windows and --policy beside --policies (one
    table of the named policies, no windows), --windows and --no-infinite with --replicas, and --read-ahead (or
    --no-read-ahead) with --replicas or --in-memory, whose trace no second process reads."""
    code, out, err = run("simulate", str(chat), "--capacity-blocks", "300", "--page-size", "4", *args)
    assert (code, out) == (2, "") and f"{option}: not used" in err
    assert (
        run("simulate", str(chat), "--capacity-blocks", "300", "--page-size", "4", "--replicas", "2", "--seed", "5")[0]
        == 0
    )


def test_a_window_no_request_arrived_in_shows_no_hit_rate(tmp_path: Path) -> None:
    """Requests at 0 and 1,000 ms, in 4 windows: the two between them are empty, and read '0%' (an idle gap shown as
    a cold cache; the first request missed, the second hit its whole page). They read '-'."""
    path = tmp_path / "gap.jsonl"
    write_token_jsonl(path, [TokenRequest(t, (1, 2, 3, 4), 1) for t in (0.0, 1000.0)])
    code, out, _ = run("simulate", str(path), "--capacity-blocks", "8", "--page-size", "4", "--windows", "4")
    assert code == 0, out
    assert "hit rate per window: 0% - - 100%" in out


def test_trace_stats_prints_sums_past_2_53_exactly(tmp_path: Path) -> None:
    outputs = (2**53 + 1, 2**62 + 7)  # each a valid output_length; through a float their digits were lost
    lines = [json.dumps({"timestamp": i, "tokens": [1, 2, 3], "output_length": n}) for i, n in enumerate(outputs)]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    code, out, err = run("trace", "stats", str(tmp_path / "t.jsonl"))
    assert code == 0, err
    assert f"{sum(outputs):,}" in out
    code, out, _ = run("trace", "stats", str(tmp_path / "t.jsonl"), "--json")
    assert json.loads(out)["output_tokens"] == sum(outputs)


def test_the_json_windows_carry_their_tokens_and_no_hit_rate_where_none_arrived(tmp_path: Path) -> None:
    """Regression: `--json` gave an empty window (an idle gap) a hit rate of 0.0, the cold cache the table's '-' was
    made to stop showing, and no token counts, so windows could not be merged into a rate over a longer span."""
    path = tmp_path / "gap.jsonl"
    write_token_jsonl(path, [TokenRequest(t, (1, 2, 3, 4, 5, 6), 1) for t in (0.0, 10.0, 1000.0)])
    code, out, _ = run("simulate", str(path), "--capacity-blocks", "8", "--page-size", "4", "--windows", "4", "--json")
    assert code == 0, out
    report = json.loads(out)
    # The first request misses its whole page (4 of its 6 tokens are a whole page), the next two hit it.
    expected = [(2, 12, 4, 4 / 12), (0, 0, 0, None), (0, 0, 0, None), (1, 6, 4, 4 / 6)]
    got = [(w["requests"], w["prompt_tokens"], w["hit_tokens"], w["hit_rate"]) for w in report["windows"]]
    assert got == expected
    assert sum(w["hit_tokens"] for w in report["windows"]) == report["hit_tokens"] == 8
