"""runtime.model.kernel_tune and kernel_plan: kernels chosen by measurement on a tiny model, with the cache folder under
tmp_path. The choice is measured once and read back after; it is per thread count and model; "retune" measures
again and "fixed" restores the fixed rules; a damaged or foreign cache file, or a folder that cannot be written,
costs a warning and a new measurement, never a crash; a busy machine stops the measurement (fixed rules, nothing
cached)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch

from radixcache.runtime.machine import cpu_model
from radixcache.runtime.model import kernel_tune
from radixcache.runtime.model.kernel_plan import BUCKETS, KernelPlan, cache_dir, plan_file, read_plan
from radixcache.runtime.model.kernel_tune import BusyGuard, MachineBusy, choose_kernels, model_linears, tunable
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.native import NativeBuildError
from radixcache.runtime.testing import random_weights, tiny_config


@pytest.fixture
def kernel_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XDG_CACHE_HOME under tmp_path (returns the kernels folder), and no busy check: the other programs of a
    shared test machine must not stop the measurement (test_a_busy_machine_* restores it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(kernel_tune, "BUSY_WAITING", float("inf"))
    return tmp_path / "xdg" / "radixcache" / "kernels"


def _model(**overrides: object) -> LlamaModel:
    config = tiny_config(**overrides)
    return LlamaModel(config, random_weights(config, seed=4))


def _shape(layer) -> str:
    return f"{layer.weight.shape[0]}x{layer.weight.shape[1]}"


def _key(model: LlamaModel, threads: int = 1) -> dict:
    return kernel_tune.model_key(tunable(model), threads)


def test_auto_measures_once_caches_and_then_reads_the_cache(kernel_home: Path) -> None:
    model = _model()
    plan = choose_kernels(model, "auto", 1)
    assert plan.source == "measured" and plan.seconds > 0
    assert plan.path is not None and Path(plan.path).parent == kernel_home and Path(plan.path).is_file()
    shapes = {_shape(layer) for layer in model_linears(model)}
    assert set(plan.choices) == shapes and all(set(c) == set(BUCKETS) for c in plan.choices.values())
    every = {"linear", "mm_t", "onednn"} | ({"native"} if model_linears(model)[0].can_run("native") else set())
    # "native" is timed at decode buckets only (past 8 rows it reads W once per 8 rows)
    for s in shapes:
        assert set(plan.timings_us[s][1]) == every and set(plan.timings_us[s][16]) == every - {"native"}
    for layer in model_linears(model):
        assert layer.paths == plan.by_rows(_shape(layer))
    saved = json.loads(Path(plan.path).read_text())
    assert saved["key"]["cpu"] == cpu_model() and saved["key"]["torch"] == torch.__version__
    assert saved["key"]["threads"] == 1 and {s for s, _ in saved["key"]["shapes"]} == shapes

    again = _model()
    cached = choose_kernels(again, "auto", 1)
    assert cached.source == "cache" and cached.choices == plan.choices and cached.path == plan.path
    assert all(layer.paths == cached.by_rows(_shape(layer)) for layer in model_linears(again))
    assert choose_kernels(_model(), "retune", 1).source == "measured"
    assert len(list(kernel_home.iterdir())) == 1  # retune replaced the file


def test_a_plan_is_per_thread_count_and_per_model(kernel_home: Path) -> None:
    model, wider = _model(), _model(hidden_size=48, num_heads=6, num_kv_heads=3)
    paths = {choose_kernels(model, "auto", 1).path, choose_kernels(wider, "auto", 1).path}
    assert len(paths) == 2 and all(Path(p).is_file() for p in paths)
    assert str(plan_file(_key(model, threads=2))) not in paths  # measured again for another thread count
    assert _key(model, threads=2)["threads"] == 2


def test_fixed_keeps_the_fixed_rules_and_writes_nothing(kernel_home: Path) -> None:
    model = _model()
    choose_kernels(model, "auto", 1)
    for path in list(kernel_home.iterdir()):
        path.unlink()
    plan = choose_kernels(model, "fixed", 1)
    assert plan.source == "fixed" and plan.choices == {} and "fixed" in plan.note
    assert all(layer.paths is None for layer in model_linears(model))
    assert not list(kernel_home.iterdir())


def test_a_model_with_nothing_to_choose_keeps_the_fixed_rules(kernel_home: Path) -> None:
    config = tiny_config()
    weights = random_weights(config, seed=1)
    for model in (LlamaModel(config, weights, dtype=torch.float64), LlamaModel(config, weights, quant="fp16")):
        plan = choose_kernels(model, "auto", 1)
        assert plan.source == "fixed" and "no float32" in plan.note
    assert not kernel_home.exists()


def test_an_unknown_mode_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="kernels must be one of auto, fixed, retune") as exc:
        choose_kernels(_model(), "fastest", 1)
    assert "'fastest'" in str(exc.value)


def _valid(model: LlamaModel) -> dict:
    shapes = {_shape(layer) for layer in model_linears(model)}
    choices = {s: dict.fromkeys(BUCKETS, "linear") for s in shapes}
    return KernelPlan(_key(model), choices).to_json()


def _damaged(model: LlamaModel, kind: str) -> bytes:
    good = _valid(model)
    if kind == "not json":
        return b"{'format': 1,"
    if kind == "binary":
        return bytes(range(256))
    if kind == "truncated":
        return json.dumps(good).encode()[:-40]
    if kind == "a list":
        return b"[1, 2, 3]"
    if kind == "deeply nested":  # json.loads raises RecursionError, not ValueError
        return b"[" * 200_000
    if kind == "another machine":
        good["key"]["cpu"] = "Some Other CPU"
    elif kind == "another torch":
        good["key"]["torch"] = "1.0.0"
    elif kind == "another format":
        good["format"] = 99
    elif kind == "other buckets":
        good["buckets"] = [1, 2, 4]
    elif kind == "an unknown path":
        next(iter(good["choices"].values()))["1"] = "gemv_turbo"
    elif kind == "a missing bucket":
        next(iter(good["choices"].values())).pop("64")
    elif kind == "a missing shape":
        good["choices"].pop(next(iter(good["choices"])))
    elif kind == "choices not a dict":
        good["choices"] = "linear"
    return json.dumps(good).encode()


DAMAGE = [
    "not json",
    "binary",
    "truncated",
    "a list",
    "deeply nested",
    "another machine",
    "another torch",
    "another format",
    "other buckets",
    "an unknown path",
    "a missing bucket",
    "a missing shape",
    "choices not a dict",
]


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_or_foreign_cache_file_is_ignored_with_a_warning(
    kernel_home: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = _model()
    path = plan_file(_key(model))
    path.parent.mkdir(parents=True)
    path.write_bytes(_damaged(model, kind))
    with caplog.at_level(logging.WARNING, logger="radixcache.kernels"):
        plan = choose_kernels(model, "auto", 1)
    warned = [r.getMessage() for r in caplog.records if r.name == "radixcache.kernels"]
    assert len(warned) == 1 and str(path) in warned[0], warned
    assert plan.source == "measured" and plan.path == str(path)
    assert read_plan(_key(model)) is not None  # replaced by a good one


def test_a_valid_file_is_used_as_it_says(kernel_home: Path) -> None:
    """What the file names is what runs (here every shape on F.linear), however the machine measures."""
    model = _model()
    path = plan_file(_key(model))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_valid(model)))
    plan = choose_kernels(model, "auto", 1)
    assert plan.source == "cache"
    assert all(set(layer.paths) == {"linear"} and layer._packed is None for layer in model_linears(model))


def test_a_folder_that_cannot_be_written_costs_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(kernel_tune, "BUSY_WAITING", float("inf"))
    model = _model()
    with caplog.at_level(logging.WARNING, logger="radixcache.kernels"):
        plan = choose_kernels(model, "auto", 1)
    assert plan.source == "measured" and plan.path is None
    assert any("not cached" in r.getMessage() for r in caplog.records)
    assert all(layer.paths is not None for layer in model_linears(model))


def test_the_folder_follows_xdg_cache_home_when_it_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" / "radixcache" / "kernels"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for ignored in ("relative/dir", ""):  # the XDG spec: a relative value is invalid and ignored
        monkeypatch.setenv("XDG_CACHE_HOME", ignored)
        assert cache_dir() == tmp_path / "home" / ".cache" / "radixcache" / "kernels"


def test_a_busy_machine_stops_the_measurement(
    kernel_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """1.5 threads waiting for a core on average (a fake run-queue clock): the measurement stops at its first check,
    the layers keep the fixed rules and nothing is cached."""
    monkeypatch.setattr(kernel_tune, "BUSY_WAITING", 0.3)
    monkeypatch.setattr(kernel_tune, "BUSY_AFTER_S", 0.0)
    clock = kernel_tune.time.perf_counter
    monkeypatch.setattr(kernel_tune, "run_queue_wait", lambda: 1.5 * clock())
    model = _model()
    with caplog.at_level(logging.WARNING, logger="radixcache.kernels"):
        plan = choose_kernels(model, "auto", 2)
    assert plan.source == "fixed" and plan.note.startswith("machine busy: 1.5")
    assert any("busy" in r.getMessage() for r in caplog.records)
    assert all(layer.paths is None for layer in model_linears(model))
    assert not kernel_home.exists()


def test_the_busy_guard_waits_its_time_then_judges() -> None:
    now = [0.0]
    waited = [0.0]
    guard = BusyGuard(2, threshold=0.3, after_s=1.0, wait=lambda: waited[0], clock=lambda: now[0])
    now[0], waited[0] = 0.5, 0.5  # 1 thread waiting, but too early to judge
    guard.check()
    now[0], waited[0] = 2.0, 0.2  # 0.1 threads waiting on average: not busy
    guard.check()
    now[0], waited[0] = 3.0, 1.5
    with pytest.raises(MachineBusy, match=r"0\.50 of 2 threads"):
        guard.check()
    # Without a run-queue clock: the threads asked for minus the CPU time got (none, while the clock jumps 10 s)
    now[0] = 0.0
    fallback = BusyGuard(2, threshold=0.3, after_s=1.0, wait=lambda: None, clock=lambda: now[0])
    now[0] = 10.0
    assert fallback.waiting() > 1.9
    with pytest.raises(MachineBusy):
        fallback.check()


def test_native_keeps_a_bucket_unless_another_path_is_clearly_faster() -> None:
    """Timed product by product, "native" cannot show the whole-pass call it enables: within NATIVE_CREDIT of the
    fastest it is kept; past it, or where it is not timed (compute-bound buckets), the fastest wins."""
    credit = kernel_tune.NATIVE_CREDIT
    near = {"mm_t": 100.0, "native": 100.0 * (1 + credit) - 0.01, "onednn": 150.0}
    far = {"mm_t": 100.0, "native": 100.0 * (1 + credit) + 0.01, "onednn": 150.0}
    untimed = {"mm_t": 100.0, "onednn": 90.0, "linear": 120.0}
    chosen = kernel_tune._choose({1: near, 2: far, 16: untimed})
    assert (chosen[1], chosen[2], chosen[16]) == ("native", "mm_t", "onednn")
    assert chosen[3] == chosen[8] == "mm_t" and chosen[64] == chosen[256] == "onednn"  # the largest timed below
    assert kernel_tune._choose({1: {"native": 90.0, "mm_t": 100.0}})[1] == "native"


def test_a_plan_chosen_by_another_rule_is_measured_again(kernel_home: Path) -> None:
    model = _model()
    plan = choose_kernels(model, "auto", 1)
    assert plan.source == "measured" and plan.key["rule"] == kernel_tune.CHOICE_RULE
    with pytest.MonkeyPatch.context() as m:
        m.setattr(kernel_tune, "CHOICE_RULE", "another rule")
        assert choose_kernels(model, "auto", 1).source == "measured"
    assert choose_kernels(model, "auto", 1).source == "cache"


def test_a_plan_naming_native_is_not_applied_where_the_native_library_is_missing(
    kernel_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan measured with a C compiler chose "native"; the same cache folder read by a run without one (CC unset
    in another shell, a container sharing the home) made use_paths refuse it: the engine failed to start."""
    model = _model()
    if not model_linears(model)[0].can_run("native"):
        pytest.skip("the native library does not build here")
    plan = _valid(model)
    plan["choices"] = {s: dict.fromkeys(map(str, BUCKETS), "native") for s in plan["choices"]}
    path = plan_file(_key(model))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(plan))
    assert choose_kernels(_model(), "auto", 1).source == "cache"

    def no_library() -> None:
        raise NativeBuildError("no C compiler (test)")

    monkeypatch.setattr("radixcache.runtime.native.blockdot", no_library)
    without = _model()
    got = choose_kernels(without, "auto", 1)
    assert got.source == "measured" and got.path != str(path)
    assert all("native" not in layer.paths for layer in model_linears(without))
    assert json.loads(path.read_text())["choices"] == plan["choices"]  # the other run's plan is kept


def test_without_a_home_folder_the_plan_serves_the_run_with_a_warning(
    no_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No HOME and no passwd entry: no folder to cache in, as one that cannot be written (never a crash); an
    absolute XDG_CACHE_HOME still serves."""
    monkeypatch.setattr(kernel_tune, "BUSY_WAITING", float("inf"))
    model = _model()
    with caplog.at_level(logging.WARNING, logger="radixcache.kernels"):
        plan = choose_kernels(model, "auto", 1)
    assert plan.source == "measured" and plan.path is None
    warned = [r.getMessage() for r in caplog.records if r.name == "radixcache.kernels"]
    assert len(warned) == 1 and "not cached" in warned[0] and "XDG_CACHE_HOME" in warned[0], warned
    assert all(layer.paths is not None for layer in model_linears(model))
    monkeypatch.setenv("XDG_CACHE_HOME", str(no_home / "xdg"))
    assert choose_kernels(model, "auto", 1).path == str(plan_file(_key(model)))
    assert choose_kernels(model, "auto", 1).source == "cache"


def test_a_plans_non_finite_display_fields_are_left_out(kernel_home: Path) -> None:
    """A cached plan's `seconds`, `load_average` or timings of NaN or Infinity (which Python's JSON reads) went on to
    `doctor --json`, which wrote them as no JSON parser reads them: they are left out as unparseable ones are."""
    model = _model()
    plan = _valid(model)
    shape = next(iter(plan["choices"]))
    plan |= {"seconds": float("nan"), "load_average": float("inf")}
    plan["timings_us"] = {shape: {"1": {"linear": float("nan"), "mm_t": 12.5}}}
    path = plan_file(_key(model))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(plan))
    got = choose_kernels(model, "auto", 1)
    assert got.source == "cache" and got.seconds == 0.0 and got.load_average is None
    assert got.timings_us == {shape: {1: {"mm_t": 12.5}}}
    json.loads(json.dumps(got.to_json(), allow_nan=False))  # strict JSON again


@pytest.mark.parametrize("field", ["seconds", "load_average", "timing"])
def test_a_plans_display_field_past_a_floats_range_is_left_out(kernel_home: Path, field: str) -> None:
    """A 400-digit integer (JSON reads it as a Python int) made math.isfinite raise OverflowError out of read_plan:
    the engine failed to start on a damaged cache file where every other damage costs a warning."""
    model = _model()
    plan = _valid(model)
    shape = next(iter(plan["choices"]))
    huge = 10**400
    if field == "timing":
        plan["timings_us"] = {shape: {"1": {"linear": huge, "mm_t": 12.5}}}
    else:
        plan[field] = huge
    path = plan_file(_key(model))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(plan))
    got = choose_kernels(model, "auto", 1)
    assert got.source == "cache" and got.seconds == 0.0 and got.load_average is None
    assert got.timings_us == ({shape: {1: {"mm_t": 12.5}}} if field == "timing" else {})


def test_a_measured_plan_is_synced_before_it_replaces_the_file(
    kernel_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan was renamed over its file unsynced: after a power cut the file could be empty, a damaged plan
    measured again at every start until rewritten, and a start killed mid-write left `.plan-*.json.<hex>.tmp` for
    good. The new file is fsynced while the path still holds the old one, then the folder, and a dead writer's
    leftover goes with the next write."""
    model = _model()
    path = plan_file(_key(model))
    path.parent.mkdir(parents=True)
    path.write_text("{}")  # foreign: measured again and replaced
    leftover = path.parent / f".{path.name}.4194399-0123abcd.partial"  # no process has pid 4194399
    leftover.write_text('{"half": ')
    real_fsync = os.fsync
    synced: list[tuple[int, str]] = []  # (the descriptor's inode, what the plan's path held then)

    def watching(fd: int) -> None:
        synced.append((os.fstat(fd).st_ino, path.read_text()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", watching)
    plan = choose_kernels(model, "auto", 1)
    assert plan.source == "measured" and plan.path == str(path) and read_plan(_key(model)) is not None
    mine = {path.stat().st_ino, kernel_home.stat().st_ino}
    assert [s for s in synced if s[0] in mine] == [
        (path.stat().st_ino, "{}"),
        (kernel_home.stat().st_ino, path.read_text()),
    ]
    assert [p.name for p in kernel_home.iterdir()] == [path.name]
