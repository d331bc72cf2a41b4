"""End-to-end: `radixcache replay`, `chat`, `model info`, `trace stats` on replay JSON and the plot script,
through click's CliRunner and as real subprocesses, on the tiny checkpoint and (marked slow) on SmolLM2."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from radixcache.cli.main import main


def test_replay_prints_the_summary_table_and_writes_json(runner, tiny_model_dir: Path, small_trace: Path, tmp_path):
    out = tmp_path / "r.json"
    result = runner.invoke(
        main, ["replay", str(small_trace), "--model", str(tiny_model_dir), "--max-tokens", "3", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    for label in ("requests", "prompt tokens", "cached tokens", "hit rate", "TTFT p50", "TTFT p90", "TTFT p99"):
        assert label in result.stdout
    assert "decode tokens/s" in result.stdout and "wall time" in result.stdout
    data = json.loads(out.read_text())
    assert data["summary"]["requests"] == 4 and 0 < data["summary"]["hit_rate"] < 1
    record = data["requests"][0]
    for field in ("conversation", "turn", "prompt_tokens", "cached_tokens", "prefill_tokens", "ttft_s", "latency_s"):
        assert field in record
    assert {"decode_tps", "text"} <= set(record)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_json_file_that_cannot_be_written_still_prints_the_table(
    runner, tiny_model_dir: Path, small_trace: Path, tmp_path: Path
) -> None:
    """A --json write that failed after the run (a full disk: /dev/full) raised out of the command: the table of a run
    that may have taken hours was never printed, nor the recording's lines, and the error named no file ('[Errno 28]
    No space left on device'). The table and the recording come first; then the error names --json's file (exit 1)."""
    recorded = tmp_path / "r.jsonl"
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--max-tokens", "2", "--json", "/dev/full"]
    result = runner.invoke(main, [*args, "--record-trace", str(recorded)])
    assert result.exit_code == 1, result.output
    assert re.search(r"requests\s+│\s+4\s+│", result.stdout), result.stdout
    assert f"recorded {recorded}" in result.stderr and len(recorded.read_text().splitlines()) == 4
    assert "error: cannot write --json /dev/full: No space left on device" in result.stderr
    assert "wrote /dev/full" not in result.stderr


def test_replay_without_a_trace_runs_the_sample(runner, tiny_model_dir: Path) -> None:
    result = runner.invoke(main, ["replay", "--model", str(tiny_model_dir), "--limit", "2", "--max-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert "sample_chat.jsonl" in result.stdout
    assert re.search(r"requests\s+│\s+7\s+│", result.stdout)  # support-01 (3 turns) + support-02 (4)


def test_model_envvar_picks_the_model(runner, tiny_model_dir: Path, small_trace: Path) -> None:
    result = runner.invoke(
        main, ["replay", str(small_trace), "--max-tokens", "1"], env={"RADIXCACHE_MODEL": str(tiny_model_dir)}
    )
    assert result.exit_code == 0, result.output
    assert "tiny" in result.stdout


def test_compare_prints_both_runs_ratios_and_identical_text(runner, tiny_model_dir: Path, small_trace: Path) -> None:
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--compare", "--max-tokens", "4"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "no cache / cache" in result.stdout
    assert "generated text with and without the cache: identical" in result.stdout


def test_no_cache_reports_no_hits(runner, tiny_model_dir: Path, small_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "n.json"
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--no-cache", "--max-tokens", "2"]
    result = runner.invoke(main, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["summary"]["cached_tokens"] == 0


def test_recorded_mode_token_traces_and_policy_options(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "tokens.jsonl"
    rows = [{"timestamp": i * 10, "tokens": [*range(1, 30), 40 + i], "output_length": 2} for i in range(3)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["replay", str(trace), "--model", str(tiny_model_dir), "--mode", "recorded", "--policy", "lfu"]
    result = runner.invoke(main, [*args, "--capacity-blocks", "64", "--page-size", "4", "--honor-timestamps"])
    assert result.exit_code == 0, result.output
    assert "4-token pages, 64 blocks, lfu" in " ".join(result.stdout.split())


def test_over_long_turns_are_skipped_counted_and_exit_3(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "long.jsonl"
    rows = [{"id": "long", "turns": [{"user": "z" * 5000}]}, {"id": "ok", "turns": [{"user": "hi"}]}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o.json"
    result = runner.invoke(main, ["replay", str(trace), "--model", str(tiny_model_dir), "--json", str(out)])
    assert result.exit_code == 3
    assert "warning: conversation long turn 1: 5,0" in result.stderr
    assert "skipped: too long" in result.stdout
    assert json.loads(out.read_text())["summary"]["skipped_too_long"] == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: 1 turns were skipped")


def test_ctrl_c_prints_and_saves_what_finished(runner, tiny_model_dir: Path, small_trace: Path, tmp_path, monkeypatch):
    from radixcache.runtime.engine.engine import Engine

    real, calls = Engine.generate, []

    def generate(self, prompt, *args, **kwargs):
        if kwargs.get("namespace") is None:
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
        return real(self, prompt, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", generate)
    out = tmp_path / "i.json"
    result = runner.invoke(main, ["replay", str(small_trace), "--model", str(tiny_model_dir), "--json", str(out)])
    assert result.exit_code == 130
    assert "cache (interrupted)" in result.stdout
    data = json.loads(out.read_text())
    assert data["summary"]["interrupted"] is True and len(data["requests"]) == 2


@pytest.mark.parametrize(("stop_at", "verdict"), [(3, "not compared"), (7, "identical (of the 2 of 4 requests")])
def test_compare_cut_by_ctrl_c_says_what_it_compared(
    runner, tiny_model_dir: Path, small_trace: Path, tmp_path, monkeypatch, stop_at: int, verdict: str
) -> None:
    """Ctrl-C in the cached run (the third request: the run without the cache never starts) or in the other (its
    third request, the seventh of both): the texts were compared over the requests that ran in both, none or 2 of 4,
    where the line said "identical" as if all had been."""
    from radixcache.runtime.engine.engine import Engine

    real, calls = Engine.generate, []

    def generate(self, prompt, *args, **kwargs):
        if kwargs.get("namespace") is None:
            calls.append(1)
            if len(calls) == stop_at:
                raise KeyboardInterrupt
        return real(self, prompt, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", generate)
    out = tmp_path / "c.json"
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--compare", "--max-tokens", "2"]
    result = runner.invoke(main, [*args, "--json", str(out)])
    assert result.exit_code == 130, result.output
    data = json.loads(out.read_text())
    ran_in_both = {(r["conversation"], r["turn"]) for r in data["requests"]} & {
        (r["conversation"], r["turn"]) for r in data["no_cache"]["requests"]
    }
    assert data["comparison"]["text_compared"] == len(ran_in_both) == (0 if stop_at == 3 else 2)
    assert f"generated text with and without the cache: {verdict}" in result.stdout


def test_ctrl_c_while_the_baseline_warms_up_keeps_the_cached_run(
    runner, tiny_model_dir: Path, small_trace: Path, tmp_path, monkeypatch
) -> None:
    """Ctrl-C after the cached run, while the run without the cache warmed up (or its engine was built), escaped
    compare: the finished run was neither printed nor saved ('error: interrupted' alone), where the docs say what
    finished is."""
    from radixcache.runtime.engine.engine import Engine

    real, warm_ups = Engine.generate, []

    def generate(self, prompt, *args, **kwargs):
        if kwargs.get("namespace") is not None:  # the warm-up's own namespace
            warm_ups.append(1)
            if len(warm_ups) == 2:
                raise KeyboardInterrupt
        return real(self, prompt, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", generate)
    out = tmp_path / "w.json"
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--compare", "--max-tokens", "2"]
    result = runner.invoke(main, [*args, "--json", str(out)])
    assert result.exit_code == 130, result.output
    data = json.loads(out.read_text())
    assert len(data["requests"]) == 4 and not data["summary"]["interrupted"]
    assert data["no_cache"]["summary"]["interrupted"] and data["no_cache"]["requests"] == []
    assert "no cache (interrupted)" in result.stdout


def test_trace_stats_and_the_plot_script_read_replay_json(
    runner, run_script, tiny_model_dir: Path, small_trace: Path, tmp_path: Path
) -> None:
    out = tmp_path / "c.json"
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--compare", "--max-tokens", "2"]
    assert runner.invoke(main, [*args, "--json", str(out)]).exit_code == 0
    stats = runner.invoke(main, ["trace", "stats", str(out), "--json"])
    assert stats.exit_code == 0, stats.output
    runs = json.loads(stats.stdout)
    assert [r["run"] for r in runs] == ["cache", "no cache"]
    assert runs[0]["hit_rate"] == pytest.approx(json.loads(out.read_text())["summary"]["hit_rate"])
    table = runner.invoke(main, ["trace", "stats", str(out)])
    assert table.exit_code == 0 and "replay-json" in table.stdout
    png = tmp_path / "p.png"
    script = run_script("scripts/plot_replay.py", str(out), "--out", str(png))
    assert script.returncode == 0, script.stderr
    assert png.stat().st_size > 10_000


def test_chat_shows_cached_prefilled_and_ttft_and_exits_on_eof_or_exit(runner, tiny_model_dir: Path) -> None:
    args = ["chat", "--model", str(tiny_model_dir), "--max-tokens", "3", "--system", "Be brief."]
    result = runner.invoke(main, args, input="hello\nhow are you\n/exit\nnever read\n")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if "prefilled" in line]
    assert len(lines) == 2
    assert "0 cached" in lines[0] and "TTFT" in lines[0]
    assert int(lines[1].split("[")[1].split(" cached")[0]) > 0  # the second turn reuses the first
    assert runner.invoke(main, args, input="hi\n").exit_code == 0  # EOF ends the chat


def test_model_info_reports_architecture_parameters_and_kv_bytes(runner, tiny_model_dir: Path) -> None:
    result = runner.invoke(main, ["model", "info", "--model", str(tiny_model_dir), "--json"])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout)
    assert facts["architecture"] == "llama" and facts["layers"] == 2 and facts["rope_scaling"] == "none"
    assert facts["kv_bytes_per_token_fp32"] == 2 * 2 * 2 * 8 * 4  # K and V, 2 layers, 2 KV heads, head_dim 8
    assert facts["parameters"] > 30_000


def test_model_info_names_a_scaled_rope_in_short() -> None:
    from radixcache.cli.model import rope_scaling_fact
    from radixcache.runtime.config import RopeScaling

    assert rope_scaling_fact(RopeScaling("llama3", 32.0, 8192)) == "llama3 x32"
    assert rope_scaling_fact(RopeScaling("default", freq_factors=(1.0, 8.0))) == "rope_freqs"
    assert rope_scaling_fact(RopeScaling("yarn", 4.0, freq_factors=(1.0, 8.0))) == "yarn x4 + rope_freqs"


def test_every_command_has_help_with_an_example(runner) -> None:
    for args in (["replay"], ["chat"], ["model"], ["model", "info"], ["trace", "stats"], ["simulate"]):
        result = runner.invoke(main, [*args, "--help"])
        assert result.exit_code == 0 and "Example" in result.stdout, args


def test_every_command_has_a_row_in_the_cli_docs_table() -> None:
    """docs/cli.md's table of commands lacked `doctor` and `serve`."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
    rows = {line.split("`")[1].split()[0] for line in text.splitlines() if line.startswith("| `")}
    assert set(main.commands) <= rows, set(main.commands) - rows


def test_replay_as_a_subprocess_with_the_tiny_model(run_cli, tiny_model_dir: Path, small_trace: Path, tmp_path) -> None:
    out = tmp_path / "s.json"
    args = [str(small_trace), "--model", str(tiny_model_dir), "--max-tokens", "2", "--json", str(out)]
    done = run_cli("replay", *args)
    assert done.returncode == 0, done.stderr
    assert "hit rate" in done.stdout and json.loads(out.read_text())["summary"]["requests"] == 4


@pytest.fixture
def session_smollm2(smollm2: Any, smollm2_gguf: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's load_model("smollm2", keep_blocks=...) answered by the session's loads (tests/conftest.py), not a load
    of its own; README's main command loads SmolLM2 by name, test_quant_gguf_cli its blocks."""
    from radixcache.runtime import loading

    def session_model(spec: object, keep_blocks: bool = False, **kwargs: object) -> Any:
        assert spec == loading.DEFAULT_MODEL and not kwargs, (spec, kwargs)
        return smollm2_gguf if keep_blocks else smollm2

    monkeypatch.setattr(loading, "load_model", session_model)


@pytest.mark.slow
@pytest.mark.usefixtures("session_smollm2")
def test_real_model_in_process_replays_and_reuses_the_shared_system_prompt(runner, small_trace: Path, tmp_path) -> None:
    out = tmp_path / "real.json"
    result = runner.invoke(main, ["replay", str(small_trace), "--limit", "1", "--max-tokens", "8", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["summary"]["model"].startswith("SmolLM2")
    first, second = data["requests"]
    assert "Paris" in first["text"]
    assert second["cached_tokens"] >= first["prompt_tokens"] - 16


@pytest.mark.slow
@pytest.mark.usefixtures("session_smollm2")
def test_real_model_compare_in_live_greedy_mode_generates_the_same_text(runner, small_trace: Path, tmp_path) -> None:
    """With and without the cache, greedy live replies are identical (both engines on `--quant gguf`, where that
    holds as on float32). In process: the installed command's own run as a subprocess is
    test_replay_as_a_subprocess_with_the_tiny_model's."""
    out = tmp_path / "cmp.json"
    args = ["replay", str(small_trace), "--compare", "--mode", "live", "--max-tokens", "6", "--quant", "gguf"]
    args += ["--json", str(out)]
    done = runner.invoke(main, args)
    assert done.exit_code == 0, done.output
    assert "generated text with and without the cache: identical" in done.stdout
    data = json.loads(out.read_text())
    cached = [(r["conversation"], r["turn"], r["text"]) for r in data["requests"]]
    uncached = [(r["conversation"], r["turn"], r["text"]) for r in data["no_cache"]["requests"]]
    assert cached == uncached and len(cached) == 4
    assert data["comparison"]["text_mismatches"] == 0
    assert data["summary"]["cached_tokens"] > 0 and data["no_cache"]["summary"]["cached_tokens"] == 0


def test_chat_reset_starts_a_new_conversation_that_hits_the_cache(runner, tiny_model_dir: Path) -> None:
    args = ["chat", "--model", str(tiny_model_dir), "--max-tokens", "2"]
    result = runner.invoke(main, args, input="same question\n/reset\nsame question\n")
    assert result.exit_code == 0, result.output
    first, second = [line for line in result.stdout.splitlines() if "prefilled" in line]
    assert first.startswith("[0 cached")
    assert int(second.split("[")[1].split(" cached")[0]) >= 16  # the same prompt again: whole pages from the tree


def test_chat_drops_a_turn_the_engine_refuses_and_goes_on(runner, tiny_model_dir: Path) -> None:
    """A turn past the model's context ended the whole conversation (exit 1, the history lost): it is now dropped
    with one error line, the conversation goes on with its history as before, and the command exits 1 at the end."""
    context = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]
    args = ["chat", "--model", str(tiny_model_dir), "--max-tokens", "2"]
    result = runner.invoke(main, args, input=f"hello\n{'x' * (context + 10)}\nhello again\n")
    assert result.exit_code == 1, result.output
    assert result.stderr.count("error:") == 1 and "this turn was dropped" in result.stderr, result.stderr
    assert "Traceback" not in result.output
    turns = [line for line in result.stdout.splitlines() if "prefilled" in line]
    assert len(turns) == 2 and int(turns[1].split("[")[1].split(" cached")[0]) > 0  # the first turn's history


def test_chat_with_a_model_without_a_chat_template_fails_before_reading(runner, tiny_model_dir: Path, tmp_path) -> None:
    """A model with no chat template: every line read was refused in turn ('has no chat template ... (this turn was
    dropped)', once per line) and the chat went on reading; it is one error before the first line is read."""
    import shutil

    model = shutil.copytree(tiny_model_dir, tmp_path / "no-template")
    config = json.loads((model / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    result = runner.invoke(main, ["chat", "--model", str(model), "--max-tokens", "2"], input="hi\nagain\n")
    assert result.exit_code == 1, result.output
    assert (
        result.stderr.count("error:") == 1 and "cannot chat: " in result.stderr and "no chat template" in result.stderr
    )
    assert "prefilled" not in result.stdout and "dropped" not in result.stderr


def test_replay_of_a_text_trace_on_a_model_without_a_chat_template_fails_before_the_warm_up(
    runner, tiny_model_dir: Path, tmp_path, monkeypatch
) -> None:
    """Each turn of a text trace renders with the model's chat template: without one, turn 1 failed after the
    engine's warm-up with the Python API's hint ('pass chat_template=... or encode plain text instead'), which the CLI
    has no option for. It is now refused before the warm-up, in the CLI's words (exit 1, as a bad trace is)."""
    import shutil

    from radixcache.runtime.replay import run

    model = shutil.copytree(tiny_model_dir, tmp_path / "no-template")
    config = json.loads((model / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    warmed: list[object] = []
    monkeypatch.setattr(run, "_warm_up", warmed.append)
    trace = tmp_path / "chats.jsonl"
    trace.write_text('{"id": "a", "turns": [{"user": "hi"}]}\n')
    result = runner.invoke(main, ["replay", str(trace), "--model", str(model), "--max-tokens", "2"])
    assert result.exit_code == 1, result.output
    assert f"{trace} is a text (chat) trace" in result.stderr and "has none" in result.stderr, result.stderr
    assert "chat_template=" not in result.stderr and "Traceback" not in result.output
    assert warmed == []


def test_replay_refuses_before_the_warm_up_a_system_prompt_the_chat_template_refuses(
    runner, tiny_model_dir: Path, tmp_path, monkeypatch
) -> None:
    """Some chat templates refuse a system message (Gemma's raise 'System role not supported'). The check before
    the warm-up rendered the first conversation only: a trace whose first conversation had no system prompt ran,
    then failed at the first that had one ('error: System role not supported', naming no conversation), keeping no
    result of the turns that had run. Both kinds are rendered before the warm-up."""
    import shutil

    from radixcache.runtime.replay import run

    model = shutil.copytree(tiny_model_dir, tmp_path / "no-system")
    config = json.loads((model / "tokenizer_config.json").read_text())
    refuse = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    config["chat_template"] = refuse + config["chat_template"]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    warmed: list[object] = []
    monkeypatch.setattr(run, "_warm_up", warmed.append)
    trace = tmp_path / "chats.jsonl"
    plain, guided = {"id": "plain", "turns": [{"user": "hi"}]}, {"id": "guided", "system": "Be brief."}
    rows = [plain, {**guided, "turns": [{"user": "hi"}]}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(main, ["replay", str(trace), "--model", str(model), "--max-tokens", "2"])
    assert result.exit_code == 1, result.output
    assert f"cannot replay {trace}: conversation 'guided' turn 1: System role not supported" in result.stderr
    assert warmed == []
    alone = tmp_path / "plain.jsonl"  # the template itself renders a conversation without a system prompt
    alone.write_text(json.dumps(rows[0]) + "\n")
    assert runner.invoke(main, ["replay", str(alone), "--model", str(model), "--max-tokens", "2"]).exit_code == 0


def test_trace_stats_reads_a_replay_json_from_a_pipe(runner, tiny_model_dir: Path, small_trace: Path, tmp_path):
    """`cat r.json | radixcache trace stats /dev/stdin`: detecting a replay's JSON read its first line off the pipe,
    and the reader got the rest ('/dev/stdin:1: invalid JSON'). The pipe is read once; the same stats as the file's.
    A trace in a pipe is read with or without --format (the pipe is copied once, then detected: 4c88bfd)."""
    import subprocess
    import sys

    out = tmp_path / "r.json"
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--max-tokens", "2", "--json", str(out)]
    assert runner.invoke(main, args).exit_code == 0
    from_file = runner.invoke(main, ["trace", "stats", str(out), "--json"])
    assert from_file.exit_code == 0, from_file.output
    cli = [sys.executable, "-c", "from radixcache.cli.main import run; run()", "trace", "stats", "/dev/stdin"]
    piped = subprocess.run([*cli, "--json"], input=out.read_bytes(), capture_output=True, timeout=120)
    assert piped.returncode == 0, piped.stderr.decode()
    assert json.loads(piped.stdout) == json.loads(from_file.stdout)
    trace = small_trace.read_bytes()
    want = json.loads(runner.invoke(main, ["trace", "stats", str(small_trace), "--json"]).stdout)
    detected = subprocess.run([*cli, "--json"], input=trace, capture_output=True, timeout=120)
    assert detected.returncode == 0, detected.stderr.decode()
    read = subprocess.run([*cli, "--format", want["format"], "--json"], input=trace, capture_output=True, timeout=120)
    assert read.returncode == 0, read.stderr.decode()
    assert json.loads(detected.stdout) == json.loads(read.stdout) == want
