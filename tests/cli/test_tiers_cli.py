"""The tier flags on `radixcache replay` and `radixcache chat`: a second process on the same --cache-dir is served
from disk (the replay table and JSON say so per tier), and bad sizes and prefetch settings are usage errors that
name the flag."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from radixcache.cli.main import main


def _replay(runner, model: Path, trace: Path, out: Path, *extra: str):
    args = ["replay", str(trace), "--model", str(model), "--max-tokens", "3", "--json", str(out), *extra]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text())["summary"]


def test_a_second_replay_on_the_same_cache_dir_is_served_from_disk(
    runner, tiny_model_dir: Path, small_trace: Path, tmp_path: Path, caplog
) -> None:
    caplog.set_level("INFO")
    tiers = ("--cache-dir", str(tmp_path / "kv"), "--capacity-blocks", "64", "--page-size", "4")
    first, s1 = _replay(runner, tiny_model_dir, small_trace, tmp_path / "1.json", *tiers, "--host-kv-memory", "8MiB")
    assert "from the disk tier" in first.stdout and "from the host tier" in first.stdout
    assert s1["tiers"] and s1["disk_hit_tokens"] == 0 and s1["declined_pages"] == 0
    assert s1["device_hit_tokens"] + s1["host_hit_tokens"] == s1["cached_tokens"]
    files = sorted(str(f.relative_to(tmp_path)) for f in (tmp_path / "kv").rglob("*"))
    # wait_complete: each first turn is admitted once its disk pages are read. Under the default policy (timeout,
    # 1 s) a loaded machine's readers can miss the deadline and the turn recomputes: a full run on a busy machine once
    # served 0 tokens from disk that way, files present.
    second, s2 = _replay(
        runner, tiny_model_dir, small_trace, tmp_path / "2.json", *tiers, "--prefetch-policy", "wait_complete"
    )
    # the first turn of each conversation now hits its pages on disk (the message keeps both runs' figures and tables)
    after = sorted(str(f.relative_to(tmp_path)) for f in (tmp_path / "kv" / "pages").iterdir())  # a new fingerprint?
    why = f"first run: {s1}\n{first.stdout}\nsecond run: {s2}\n{second.stdout}\nfiles: {files}\n"
    why += f"fingerprint folders after the second run: {after}\nlog: {caplog.text}"
    assert s2["disk_hit_tokens"] > 0, why
    assert s2["cached_tokens"] > s1["cached_tokens"]
    assert s2["device_hit_tokens"] + s2["host_hit_tokens"] + s2["disk_hit_tokens"] == s2["cached_tokens"]
    row = re.search(r"from the disk tier\s*│\s*([\d,]+)", second.stdout)
    assert row is not None and int(row.group(1).replace(",", "")) == s2["disk_hit_tokens"]


def test_a_replay_without_tiers_reports_no_tier_rows(runner, tiny_model_dir: Path, small_trace: Path, tmp_path: Path):
    result, summary = _replay(runner, tiny_model_dir, small_trace, tmp_path / "r.json")
    assert "from the disk tier" not in result.stdout
    assert not summary["tiers"] and summary["device_hit_tokens"] == summary["cached_tokens"]


def test_chat_persists_its_pages_for_the_next_chat(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    args = ["chat", "--model", str(tiny_model_dir), "--max-tokens", "2", "--cache-dir", str(tmp_path / "kv")]
    args += ["--page-size", "4", "--system", "You are a terse assistant who answers in one word. " * 3]
    args += ["--kv-memory", "16MiB"]  # the disk tier's prefetcher faults the whole pool in: 512 MiB by default
    first = runner.invoke(main, args, input="hello there\n")
    assert first.exit_code == 0, first.output
    assert re.search(r"\[0 cached", first.output)
    second = runner.invoke(main, args, input="hello there\n")  # a new engine: only the disk has the pages
    assert second.exit_code == 0, second.output
    cached = int(re.search(r"\[(\d+) cached", second.output).group(1))
    assert cached > 100


def test_bad_tier_sizes_are_usage_errors_naming_the_flag(runner, tiny_model_dir: Path, small_trace: Path) -> None:
    for flag in ("--host-kv-memory", "--cache-dir-size"):
        result = runner.invoke(main, ["replay", str(small_trace), "--model", str(tiny_model_dir), flag, "lots"])
        assert result.exit_code == 2 and flag in result.output, result.output
    result = runner.invoke(main, ["replay", "--model", str(tiny_model_dir), "--write-policy", "sometimes"])
    assert result.exit_code == 2 and "--write-policy" in result.output
    for flag, value in (
        ("--prefetch-policy", "sometimes"),
        ("--prefetch-timeout-ms", "-1"),
        ("--prefetch-pages-per-step", "-2"),
    ):
        result = runner.invoke(main, ["replay", str(small_trace), "--model", str(tiny_model_dir), flag, value])
        assert result.exit_code == 2 and flag in result.output and value in result.output, result.output


def test_the_prefetch_flags_reach_the_engine_configuration() -> None:
    from radixcache.cli.engine_options import tier_kwargs
    from radixcache.runtime.engine.engine_config import EngineConfig

    kwargs = tier_kwargs(None, "kv", "1GiB", "write_back", "best_effort", 250.0, 4)
    config = EngineConfig(**kwargs)
    assert (config.prefetch_policy, config.prefetch_timeout_ms, config.write_policy) == (
        "best_effort",
        250.0,
        "write_back",
    )
    assert config.prefetch_pages_per_step == 4


@pytest.mark.parametrize("command", ["replay", "chat", "serve"])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--write-policy", "write_back"], "--write-policy is for the host tier: add --host-kv-memory"),
        (["--write-policy", "write_back", "--cache-dir", "kv"], "--write-policy is for the host tier"),
        (["--cache-dir-size", "1GiB"], "--cache-dir-size is for the disk tier: add --cache-dir"),
        (["--prefetch-policy", "best_effort"], "--prefetch-policy is for the disk tier"),
        (["--prefetch-pages-per-step", "4", "--host-kv-memory", "8MiB"], "--prefetch-pages-per-step is for the disk"),
    ],
)
def test_a_tiers_option_without_its_tier_is_refused(runner, tmp_path: Path, command: str, args, message) -> None:
    """These were ignored without a word: the engine builds no tier for them (the disk tier is always written
    through, so --write-policy is the host tier's alone)."""
    result = runner.invoke(main, [command, "--model", str(tmp_path / "no-model"), *args])
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_compare_runs_its_baseline_without_the_tiers(tiny_model_dir: Path, small_trace: Path, tmp_path: Path) -> None:
    """`replay --compare --cache-dir DIR` ran the cached replay, then failed building the baseline (an Engine with no
    cache refuses tiers), losing the run: the baseline now has no tiers under it."""
    from radixcache.runtime.replay import ReplayConfig, compare, engine_factory, load_replay_trace

    kv = {"cache_dir": str(tmp_path / "kv"), "host_kv_memory": "8MiB", "kv_memory": "16MiB"}  # 16: see above
    make = engine_factory(str(tiny_model_dir), page_size=4, **kv)
    result = compare(make, load_replay_trace(small_trace), ReplayConfig(max_tokens=2))
    assert result.cached.summary.tiers and result.cached.summary.cached_tokens > 0
    assert not result.uncached.summary.tiers and result.uncached.summary.cached_tokens == 0
    assert result.text_mismatches == 0


@pytest.mark.parametrize("command", ["replay", "chat", "serve"])
@pytest.mark.parametrize("tier", [["--cache-dir", "kv"], ["--host-kv-memory", "8MiB"]])
def test_no_cache_with_a_tier_is_a_usage_error(runner, tmp_path: Path, command: str, tier: list[str]) -> None:
    """The engine refused it, but only once the model had loaded, naming its own arguments, not the options."""
    result = runner.invoke(main, [command, "--model", str(tmp_path / "no-model"), "--no-cache", *tier])
    assert result.exit_code == 2 and "--no-cache keeps no pages" in result.stderr, result.output
