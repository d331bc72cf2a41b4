"""`radixcache doctor` on the tiny checkpoint, with the kernel cache under tmp_path: its JSON holds this machine's CPU
and flags (checked against /proc/cpuinfo read here), torch, a bandwidth, the measured kernel per shape (measured
the first time, read from the cache the next), and a decode whose bound is bandwidth / the checkpoint's weight
bytes (counted here from the safetensors file); the text form says the same; bad options are one-line errors with a
non-zero exit. On a small Q4_K_M file (scripts/write_q4_k_m_smollm2.py --shape) with --quant gguf it names the block
kinds of the layers and the head and the activations each runs, as --gguf-activations asks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from radixcache.cli.main import main
from radixcache.runtime import doctor
from radixcache.runtime.machine import STEADY_TOLERANCE, bandwidth_steady, cpu_fields
from radixcache.runtime.model import kernel_tune
from tests.cli.conftest import SMALL_Q4_K_M_GROUP

ARGS = ["--threads", "1", "--tokens", "6", "--prompt-tokens", "12", "--bandwidth-mb", "16"]
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture
def kernel_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("RADIXCACHE_KERNELS")  # the suite's "fixed": doctor's default is "auto"
    monkeypatch.setattr(kernel_tune, "BUSY_WAITING", float("inf"))  # a shared test machine must not stop it
    return tmp_path / "xdg" / "radixcache" / "kernels"


def _weight_bytes(model_dir: Path) -> int:
    weights = load_file(str(model_dir / "model.safetensors"))
    return sum(
        w.numel() * 4
        for name, w in weights.items()
        if name.endswith(".weight") and (any(p in name for p in LINEAR) or name == "lm_head.weight")
    )


def test_bandwidth_readings_are_steady_within_a_tenth_of_the_larger() -> None:
    assert bandwidth_steady(60.0, 60.0) and bandwidth_steady(66.0, 60.0) and bandwidth_steady(60.0, 66.0)
    assert not bandwidth_steady(66.1, 59.4) and not bandwidth_steady(35.0, 62.0)
    assert bandwidth_steady(35.0, 62.0, tolerance=0.5)
    with pytest.raises(ValueError, match="tolerance"):
        bandwidth_steady(1.0, 1.0, tolerance=-0.1)


def test_doctor_says_when_the_memory_changed_speed_during_its_decode(
    runner: CliRunner, tiny_model_dir: Path, kernel_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readings of 30 then 60 GB/s around the decode: the bound uses 45, and the report says the share is
    uncertain (the JSON's `steady` false); 40 then 41: no such line."""
    feed: list[float] = []  # the readings the next run takes, in order
    monkeypatch.setattr(doctor, "read_bandwidth_gbs", lambda *a, **k: feed.pop(0))
    for readings, steady in (([30.0, 60.0], False), ([40.0, 41.0], True)):
        feed[:] = readings
        out = runner.invoke(main, ["doctor", "--model", str(tiny_model_dir), *ARGS, "--json"])
        assert out.exit_code == 0, out.output
        r = json.loads(out.output)
        assert r["bandwidth_read"] == {"before": readings[0], "after": readings[1], "steady": steady}
        assert r["bandwidth_gbs"] == sum(readings) / 2
        feed[:] = readings
        text = runner.invoke(main, ["doctor", "--model", str(tiny_model_dir), *ARGS]).output
        assert ("the memory's speed moved during the decode" in text) is not steady, text


def test_doctor_reports_the_machine_the_kernels_and_the_decode_against_its_bound(
    runner: CliRunner, tiny_model_dir: Path, kernel_home: Path
) -> None:
    out = runner.invoke(main, ["doctor", "--model", str(tiny_model_dir), *ARGS, "--json"])
    assert out.exit_code == 0, out.output
    r = json.loads(out.output)
    flags = set(cpu_fields().get("flags", "").split())
    assert r["flags"] == {f: (f if f != "amx" else "amx_tile") in flags for f in r["flags"]}
    assert set(r["flags"]) == {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx"}
    assert r["torch"] == torch.__version__ and r["threads"] == 1 and r["cpu"]
    assert r["bandwidth_gbs"] > 0 and r["model"] == "tiny" and r["quant"] == "none"
    assert r["weight_bytes_per_token"] == _weight_bytes(tiny_model_dir)
    k = r["kernels"]
    assert k["mode"] == "auto" and k["source"] == "measured" and Path(k["file"]).parent == kernel_home
    assert set(k["shapes"]) == {"64x32", "32x32", "128x32", "32x64", "260x32"}  # qkv (32+16+16), o, gate_up, down, head
    for shape in k["shapes"].values():
        assert set(shape["paths"].values()) <= {"linear", "mm_t", "onednn", "native"} and shape["gbs_1_row"]
        assert next(iter(shape["paths"])).startswith("1") and list(shape["paths"])[-1].endswith("+")
    assert k["shapes"]["32x32"]["layers"] == 2 and k["shapes"]["260x32"]["layers"] == 1
    d = r["decode"]
    assert d["new_tokens"] == 6 and d["prompt_tokens"] == 12 and d["decode_tps"] > 0
    bound = r["bandwidth_gbs"] * 1e9 / r["weight_bytes_per_token"]
    assert d["bound_tps"] == pytest.approx(bound, rel=0.01)
    read = r["bandwidth_read"]  # before and after the decode; the bound uses their mean
    assert read["before"] > 0 and read["after"] > 0
    assert r["bandwidth_gbs"] == pytest.approx((read["before"] + read["after"]) / 2, abs=0.1)
    edge = STEADY_TOLERANCE * max(read["before"], read["after"])
    if abs(abs(read["before"] - read["after"]) - edge) > 0.1:  # each reading is rounded to 0.1 GB/s in the report:
        assert read["steady"] is bandwidth_steady(read["before"], read["after"])  # at the edge either answer holds
    assert d["of_bound"] == pytest.approx(d["decode_tps"] / d["bound_tps"], rel=0.01, abs=0.002)
    assert r["blocks"] is None  # no GGUF blocks in a float32 checkpoint

    again = runner.invoke(main, ["doctor", "--model", str(tiny_model_dir), *ARGS])
    assert again.exit_code == 0, again.output
    text = again.output
    assert f"kernels: auto, cache ({k['file']})" in text
    needles = ("cpu: ", "flags: avx2=", "torch: ", "read bandwidth: ", "before the decode", "load average: ", "tok/s")
    for needle in (*needles, "of the bound"):
        assert needle in text, needle
    assert "  32x32 x2: 1" in text  # its first row range starts at 1 row ("1-2 rows ..." or "1 rows ...")


def test_doctor_with_fixed_kernels_names_them_and_caches_nothing(
    runner: CliRunner, tiny_model_dir: Path, kernel_home: Path
) -> None:
    out = runner.invoke(main, ["doctor", "--model", str(tiny_model_dir), *ARGS, "--kernels", "fixed", "--json"])
    assert out.exit_code == 0, out.output
    k = json.loads(out.output)["kernels"]
    assert k["mode"] == "fixed" and k["source"] == "fixed" and k["shapes"] == {} and k["file"] is None
    assert not kernel_home.exists()


@pytest.mark.parametrize("prompt", ["4096", "99999999999999"])
def test_a_prompt_past_the_context_is_one_line_before_anything_is_drawn(
    runner: CliRunner, tiny_model_dir: Path, prompt: str
) -> None:
    """A prompt longer than the context was refused by the engine, but only after its ids were drawn: at 1e14 tokens
    that was an 800 TB allocation, an internal RuntimeError. The tiny model's context is 4,096."""
    args = ["doctor", "--model", str(tiny_model_dir), *ARGS, "--kernels", "fixed", "--prompt-tokens", prompt]
    out = runner.invoke(main, args)
    assert out.exit_code == 1, out.output
    assert f"prompt of {prompt} tokens leaves no room under the model's max_position 4096" in out.output
    assert "internal error" not in out.output


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (["--tokens", "1"], "--tokens", 2),
        (["--prompt-tokens", "0"], "--prompt-tokens", 2),
        (["--bandwidth-mb", "4"], "--bandwidth-mb", 2),
        (["--threads", "0"], "--threads", 2),
        (["--threads", "1025"], "--threads", 2),
        (["--kernels", "fastest"], "--kernels", 2),
        (["--quant", "int3"], "--quant", 2),
        (["--gguf-activations", "int8-decode"], "--quant gguf", 2),
        (["--quant", "gguf", "--gguf-activations", "int4"], "--gguf-activations", 2),
        (["--kernels", "fixed", "--retune-kernels"], "--retune-kernels", 2),
        (["--model", "/nonexistent/model-dir"], "/nonexistent/model-dir", 1),
    ],
    ids=[
        "tokens",
        "prompt",
        "bandwidth",
        "threads",
        "threads-max",
        "kernels",
        "quant",
        "acts-no-gguf",
        "acts",
        "fixed-retune",
        "model",
    ],
)
def test_bad_options_are_one_line_errors(
    runner: CliRunner, tiny_model_dir: Path, kernel_home: Path, args: list[str], message: str, code: int
) -> None:
    out = runner.invoke(main, ["doctor", "--model", str(tiny_model_dir), *ARGS, *args])
    assert out.exit_code == code, out.output
    assert message in out.output and "Traceback" not in out.output
    assert not kernel_home.exists()  # refused before anything was measured


@pytest.mark.xdist_group(SMALL_Q4_K_M_GROUP)  # the session fixture's file, written by one worker
@pytest.mark.parametrize("activations", [None, "float", "int8-decode"])
def test_doctor_names_the_gguf_kinds_and_their_activations(
    runner: CliRunner, small_q4_k_m: Path, kernel_home: Path, monkeypatch: pytest.MonkeyPatch, activations: str | None
) -> None:
    monkeypatch.delenv("RADIXCACHE_GGUF_ACTIVATIONS", raising=False)
    args = ["doctor", "--model", str(small_q4_k_m), "--quant", "gguf", *ARGS, "--kernels", "fixed"]
    args += ["--gguf-activations", activations] if activations else []
    out = runner.invoke(main, [*args, "--json"])
    assert out.exit_code == 0, out.output
    r = json.loads(out.output)
    # 2 layers: q/k/v, o, gate/up and down parts in Q4_K but v and down of layer 0 in Q6_K; the head Q6_K, which
    # takes int16-decode beside the default and float beside the others (block_linear.head_activations)
    head = "int16-decode" if activations is None else "float"
    assert r["blocks"] == {
        "layers": {"Q4_K": 12, "Q6_K": 2},
        "layer_activations": [activations or "int16-decode"],
        "head": {"Q6_K": 1},
        "head_activations": head,
    }
    assert r["quant"] == "gguf" and r["decode"]["decode_tps"] > 0
    text = runner.invoke(main, args).output
    mode = activations or "int16-decode"
    assert f"gguf blocks: layers Q4_K 12, Q6_K 2 (activations {mode}); output head Q6_K 1 (activations {head})" in text


def test_doctor_reports_without_a_load_average(
    runner: CliRunner, tiny_model_dir: Path, kernel_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the system gives no load average (/proc/loadavg unreadable: os.getloadavg raises OSError), doctor still
    reports, with the averages unknown: None in the JSON, "-" in the text."""

    def unreadable() -> tuple[float, float, float]:
        raise OSError("Load averages are unobtainable")

    monkeypatch.setattr(os, "getloadavg", unreadable)
    out = runner.invoke(main, ["doctor", "--model", str(tiny_model_dir), *ARGS, "--kernels", "fixed", "--json"])
    assert out.exit_code == 0, out.output
    r = json.loads(out.output)
    assert r["load_average"] == {"1m": None, "5m": None, "15m": None}
    assert r["decode"]["load_average_1m"] is None and r["decode"]["decode_tps"] > 0
    text = runner.invoke(main, ["doctor", "--model", str(tiny_model_dir), *ARGS, "--kernels", "fixed"])
    assert text.exit_code == 0 and "load average: - - -" in text.output, text.output
