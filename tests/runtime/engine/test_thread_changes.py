"""Changing the engine's thread count between steps (runtime.engine.threads) changes no output: with a probe that
makes the controller flip between 2 threads and 1 after every step, requests that arrive mid-decode (one of them
hitting the cache) give the greedy tokens and logits of a fixed-thread engine, and of the plain reference for the
tiny model; every forward pass runs on one count from start to end. SmolLM2 (fp32 and --quant gguf, whose native
kernel runs on the same OpenMP pool) is checked the same way in the slow tests."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from radixcache.runtime import Engine, GenerationResult
from radixcache.runtime.engine import threads as threads_module
from radixcache.runtime.engine.threads import ControllerSettings, Reading
from radixcache.runtime.model.reference import reference_greedy
from radixcache.runtime.testing import RandomModel

TOL = 1e-4
FLIP = ControllerSettings(window_s=0.0, drop_windows=1, raise_after_s=0.0, max_raise_after_s=0.0)


class FlipProbe:
    """Every window (one step, with FLIP) reads as starved (a thread waiting) and the next as two cores idle."""

    def __init__(self) -> None:
        self.reads = 0
        self.wait = self.idle = 0.0

    def read(self) -> Reading:
        self.reads += 1
        if self.reads % 2 == 0:  # a window's closing read
            if self.reads % 4 == 2:
                self.wait += 1.0
            else:
                self.idle += 2.0
        return Reading(run=0.0, wait=self.wait, idle=self.idle)


def flipping(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Make `engine`'s controller flip after every step; returns the (threads at start, at end) of each pass."""
    monkeypatch.setattr(threads_module, "default_probe", FlipProbe)
    engine.thread_control.settings = FLIP
    passes: list[tuple[int, int]] = []
    step = engine.runner.step

    def recorded(*args: Any) -> Any:
        before = torch.get_num_threads()
        out = step(*args)
        passes.append((before, torch.get_num_threads()))
        return out

    monkeypatch.setattr(engine.runner, "step", recorded)
    return passes


def mid_decode(engine: Engine, prompts: list[list[int]], new: int, after: int) -> list[GenerationResult]:
    """Submit prompts[0], then each next one once the previous has `after` output tokens (mid-decode)."""
    handles = [engine.submit(prompts[0], new, return_logits=True, ignore_eos=True)]
    for p in prompts[1:]:
        deadline = time.monotonic() + 60
        while len(handles[-1].request.output_ids) < after and not handles[-1].done():
            assert time.monotonic() < deadline, "the engine made no progress"
            time.sleep(0.001)
        handles.append(engine.submit(p, new, return_logits=True, ignore_eos=True))
    return [h.result(timeout=120) for h in handles]


def check_same(got: list[GenerationResult], want: list[GenerationResult]) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        assert (a.logits - b.logits).abs().max().item() < TOL


def prompts_for(vocab: int, base: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(base, vocab, (40,), generator=g).tolist()
    other = torch.randint(base, vocab, (23,), generator=g).tolist()
    # the third continues the first's prompt: it arrives mid-decode and hits the cache
    return [shared, other, shared + torch.randint(base, vocab, (9,), generator=g).tolist()]


def assert_flipped(passes: list[tuple[int, int]], engine: Engine) -> None:
    assert all(before == after for before, after in passes)  # no pass changed threads midway
    assert {before for before, _ in passes} == {1, 2}
    assert engine.stats.thread_changes >= len(passes) // 2
    assert engine.stats.threads in (1, 2)


def test_greedy_outputs_do_not_change_when_threads_change_mid_decode(
    tiny: RandomModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = prompts_for(tiny.config.vocab_size)
    fixed = Engine(tiny, threads=2, thread_policy="fixed", capacity_blocks=64, page_size=4)
    want = [fixed.generate(p, 24, return_logits=True, ignore_eos=True) for p in prompts]
    engine = Engine(tiny, threads=2, capacity_blocks=64, page_size=4)
    passes = flipping(engine, monkeypatch)
    got = mid_decode(engine, prompts, 24, after=5)
    check_same(got, want)
    for p, r in zip(prompts, got, strict=True):
        assert list(r.token_ids) == reference_greedy(tiny.config, tiny.weights, p, 24)
    assert got[2].cached_tokens > 0  # it arrived mid-decode and reused the first prompt's pages
    assert_flipped(passes, engine)
    assert fixed.stats.thread_changes == 0 and fixed.stats.threads == 2


def test_a_fixed_engine_runs_its_configured_count(tiny: RandomModel) -> None:
    engine = Engine(tiny, threads=1, thread_policy="fixed", capacity_blocks=32, page_size=4)
    seen: list[int] = []
    engine._loop.call(lambda _s: seen.append(torch.get_num_threads())).result(timeout=30)  # on the loop thread
    assert seen == [1] and engine.stats.threads == 1


def test_the_loop_thread_starts_on_the_controllers_count(tiny: RandomModel) -> None:
    engine = Engine(tiny, threads=2, capacity_blocks=32, page_size=4)
    engine.thread_control.threads = 1  # as the controller leaves it after a busy spell
    seen: list[int] = []
    done = threading.Event()

    def probe(_s: Any) -> None:
        seen.append(torch.get_num_threads())
        done.set()

    engine._loop.call(probe).result(timeout=30)
    assert done.is_set() and seen == [1]


class QuietProbe:
    """No thread waiting, no core idle (the controller keeps its count); `others` other programs' threads running
    when a stretch of work begins (LinuxProbe.others_running)."""

    def __init__(self, others: int) -> None:
        self.others = others

    def read(self) -> Reading:
        return Reading(run=0.0, wait=0.0, idle=0.0)

    def others_running(self) -> int:
        return self.others


@pytest.mark.parametrize("others", [0, 1])
def test_a_prompt_beside_other_programs_prefills_in_short_steps_until_a_window_closes(
    tiny: RandomModel, monkeypatch: pytest.MonkeyPatch, others: int
) -> None:
    """With other programs running when the work begins, the loop keeps each prefill step to PROBE_PREFILL_TOKENS
    until the controller's first window closes (here never: a window of a minute, so the whole prompt goes in such
    steps); on an idle machine the prompt is one step. The tokens are the same."""
    monkeypatch.setattr(threads_module, "default_probe", lambda: QuietProbe(others))
    engine = Engine(tiny, threads=2, capacity_blocks=128, page_size=4)
    engine.thread_control.settings = ControllerSettings(window_s=60.0)
    chunks: list[int] = []
    step = engine.runner.step

    def recorded(decodes: Any, parts: Any) -> Any:
        chunks.extend(n for _, n in parts)
        return step(decodes, parts)

    monkeypatch.setattr(engine.runner, "step", recorded)
    prompt = torch.randint(1, tiny.config.vocab_size, (300,), generator=torch.Generator().manual_seed(3)).tolist()
    got = engine.generate(prompt, 4, ignore_eos=True)
    cap = threads_module.PROBE_PREFILL_TOKENS
    assert chunks == ([cap, cap, 300 - 2 * cap] if others else [300])
    assert list(got.token_ids) == reference_greedy(tiny.config, tiny.weights, prompt, 4)


@pytest.mark.slow
@pytest.mark.xdist_group("quant_gguf")
@pytest.mark.parametrize("quant", ["none", "gguf"])
def test_smollm2_greedy_outputs_do_not_change_when_threads_change(
    quant: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the session's models (tests/conftest.py): load_model("smollm2"), with keep_blocks=True for "gguf"
    loaded = request.getfixturevalue("smollm2_gguf" if quant == "gguf" else "smollm2")
    # Both engines run one model, as Engine(loaded, quant=quant) builds it (the session's, tests/conftest.py): the
    # thread count is the engine's, and the model holds no state between passes.
    model = request.getfixturevalue("smollm2_gguf_model" if quant == "gguf" else "smollm2_fp32")
    prompts = prompts_for(loaded.config.vocab_size, base=100)
    fixed = Engine(model, tokenizer=loaded.tokenizer, threads=1, thread_policy="fixed", kv_memory="64MiB")
    want = [fixed.generate(p, 16, return_logits=True, ignore_eos=True) for p in prompts]
    engine = Engine(model, tokenizer=loaded.tokenizer, threads=2, kv_memory="64MiB")
    passes = flipping(engine, monkeypatch)
    got = mid_decode(engine, prompts, 16, after=4)
    check_same(got, want)
    assert got[2].cached_tokens > 0
    assert_flipped(passes, engine)


class BrokenProbe:
    """A probe whose reads fail after `good` of them (a /proc file gone or of another shape mid-run)."""

    def __init__(self, good: int) -> None:
        self.good = good

    def read(self) -> Reading:
        self.good -= 1
        if self.good < 0:
            raise OSError("/proc/stat: no such file")
        return Reading(run=0.0, wait=0.0, idle=0.0)


@pytest.mark.parametrize("good", [0, 1])
def test_a_probe_that_fails_stops_the_thread_control_and_fails_no_request(
    tiny: RandomModel, monkeypatch: pytest.MonkeyPatch, good: int
) -> None:
    """The probe failing as a window opens (good=0) or closes (good=1): the count stays, adapting stops, and the
    requests in flight and after get the reference tokens (the probe's error failed every step's requests)."""
    monkeypatch.setattr(threads_module, "default_probe", lambda: BrokenProbe(good))
    engine = Engine(tiny, threads=2, capacity_blocks=64, page_size=4)
    engine.thread_control.settings = ControllerSettings(window_s=0.0)
    prompts = prompts_for(tiny.config.vocab_size)
    got = engine.generate(prompts, 8, ignore_eos=True)
    for p, r in zip(prompts, got, strict=True):
        assert list(r.token_ids) == reference_greedy(tiny.config, tiny.weights, p, 8)
    assert not engine.thread_control.adaptive and engine.stats.threads == 2
    assert list(engine.generate(prompts[0], 4, ignore_eos=True).token_ids) == reference_greedy(
        tiny.config, tiny.weights, prompts[0], 4
    )
