"""File and model names are printed as text, never as rich markup: a trace or model folder whose name holds
brackets (`run[bold]x[i]`) lost the bracketed part from the printed name, or failed the command with rich's
MarkupError, after all the work was done. And a Hugging Face model folder so named could not be loaded at all: its
shards were listed with glob, which read `[bold]` as a character class ("no *.safetensors files")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from radixcache.cli.main import main

ODD = "run[bold]x[i]"


def test_replay_prints_a_trace_and_model_named_with_brackets_as_they_are(
    runner, tiny_model_dir: Path, small_trace: Path, tmp_path: Path
) -> None:
    trace = small_trace.rename(tmp_path / f"{ODD}.jsonl")
    model = shutil.copytree(tiny_model_dir, tmp_path / f"model{ODD}")
    result = runner.invoke(main, ["replay", str(trace), "--model", str(model), "--max-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert f"replay of {trace.name}" in result.stdout or f"replay of {trace}" in result.stdout, result.stdout
    assert f"model{ODD}" in result.stdout


def test_trace_stats_and_simulate_print_a_path_with_brackets_as_it_is(runner, tmp_path: Path) -> None:
    trace = tmp_path / f"{ODD}.jsonl"
    rows = [{"timestamp": i, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2 + i]} for i in range(3)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    simulate = ["simulate", str(trace), "--capacity-blocks", "8"]
    runs = (["trace", "stats", str(trace)], simulate, [*simulate, "--replicas", "2"])  # --replicas: its own printer
    for args in runs:
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
        assert ODD in "".join(result.stdout.split()), (args, result.stdout)  # a long title wraps


def test_model_info_prints_a_folder_named_with_brackets_as_it_is(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    model = shutil.copytree(tiny_model_dir, tmp_path / f"m{ODD}")
    result = runner.invoke(main, ["model", "info", "--model", str(model)])
    assert result.exit_code == 0, result.output
    assert f"m{ODD}" in result.stdout, result.stdout


def test_model_info_prints_the_source_path_with_brackets_as_it_is(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    """The title was text, but the rows were markup: the `source` row of `m[v2]` read `.../m`, and of `m[/x]` failed
    with an internal MarkupError."""
    for name in (f"m{ODD}", "m[/x]"):
        model = shutil.copytree(tiny_model_dir, tmp_path / name)
        result = runner.invoke(main, ["model", "info", "--model", str(model)], env={"COLUMNS": "400"})  # no "…"
        assert result.exit_code == 0, result.output
        source = next(line for line in result.stdout.splitlines() if "source" in line)
        assert str(model) in "".join(source.split("│")[2].split()), result.stdout


def test_trace_stats_prints_a_replay_jsons_model_and_label_with_brackets_as_they_are(runner, tmp_path: Path) -> None:
    """`trace stats` of a replay JSON printed its model name and run label as markup: a name like `m[/x]` failed
    with an internal MarkupError, `run[bold]x[i]` lost its brackets."""
    record = {"conversation": "a", "turn": 1, "prompt_tokens": 4, "cached_tokens": 0, "prefill_tokens": 4}
    record |= {"output_tokens": 2, "ttft_s": 0.1, "latency_s": 0.2}
    for name in (ODD, "m[/x]"):
        path = tmp_path / "r.json"
        path.write_text(json.dumps({"summary": {"model": name, "label": name}, "requests": [record]}, indent=2))
        result = runner.invoke(main, ["trace", "stats", str(path)])
        assert result.exit_code == 0, result.output
        assert "".join(result.stdout.split()).count(name) >= 2, result.stdout  # the title's run, and the model row
