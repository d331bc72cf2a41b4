"""runtime/native/decode_team.c and takeover.h: a decode pass's layers on a team whose threads never wait for each
other between phases. One thread of two made to wait after claiming each unit of work, until the other thread has
taken it over (at most 0.1 s; as a thread that keeps losing its core on a busy machine does), has its claims
finished by the other thread, and computes them still, late; the passes still give the eager layers' bits: on GGUF
blocks with each activation kernel (float, int8, 16-bit), with q/k/v bias, on a float32 model's native products,
whichever thread is the slow one, on a batch that shrinks as requests finish (the mirror's rows out of batch order on
the way). A late owner's partial values (the attention accumulates) are kept off the shared outputs by staging
copies: the 3-thread cases of test_native_layers.py on 2 cores failed 1 to 5 of 12 without them."""

from __future__ import annotations

import ctypes
import os
import shutil
import time
from typing import Any

import pytest

from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.testing import random_weights, tiny_config
from tests.runtime.engine.test_native_layers import _decode_together, _force
from tests.runtime.engine.test_native_layers import _gguf_model as native_layers_model

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the native kernels need a C compiler"
)


class StalledLayers:
    """Stands in for the model's native library: its decode layers always go the team's way, thread `slow`
    waiting after each claim until another thread took it (at most `stall_us` microseconds); counts the claims the
    others finished for it."""

    def __init__(self, lib: ctypes.CDLL, slow: int, stall_us: int) -> None:
        self._lib, self._slow, self._stall_us = lib, slow, stall_us
        self.passes = 0
        self.heads = 0  # passes whose head ran in the same call
        self.taken = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def native_decode_step(self, *args: Any) -> int:
        self.taken += self._stalled_step(args)
        return 0

    def _stalled_step(self, args: tuple[Any, ...]) -> int:
        """The pass the team's way (asserted), counted; the stalled entry's `*taken`."""
        taken = ctypes.c_long(0)
        status = self._lib.native_decode_step_stalled(*args, self._slow, self._stall_us, ctypes.byref(taken))
        assert status == 0, f"the team's way refused a pass ({status})"
        self.passes += 1
        self.heads += args[-4] is not None
        return taken.value

    def native_decode_layers(self, *args: Any) -> int:  # the layers alone: no head
        return self.native_decode_step(*args[:-1], None, None, None, None, args[-1])  # its team last


# products of several claims a thread (row_chunk: 64 KiB of weights a claim), so that both threads claim in each:
# with the suite's tiny model one thread did a whole product before the other one had prepared its activations
SHAPES = {"hidden_size": 256, "intermediate_size": 1024, "num_heads": 8, "num_kv_heads": 2, "head_dim": 32}


def _gguf_model(bias: bool) -> LlamaModel:
    """test_native_layers' GGUF-block model, in SHAPES."""
    return native_layers_model(bias, **SHAPES)


def _stalled(model: LlamaModel, slow: int) -> StalledLayers:
    plan = model.native_layers
    assert plan is not None
    stand_in = StalledLayers(plan._lib, slow, stall_us=100_000)
    plan._lib = stand_in
    return stand_in


@pytest.mark.parametrize(
    ("activations", "bias", "slow"), [("float", False, 0), ("int8", False, 1), ("int16", True, 1), ("int8", True, 0)]
)
def test_a_stalled_threads_claims_are_finished_by_the_other_and_the_bits_stay(
    monkeypatch: pytest.MonkeyPatch, activations: str, bias: bool, slow: int
) -> None:
    monkeypatch.setenv("RADIXCACHE_GGUF_ACTIVATIONS", activations)
    model = _gguf_model(bias)
    stand_in = _stalled(model, slow)
    team = _decode_together(model, 4, threads=2)
    assert stand_in.passes > 0, "the native layers never ran"
    assert stand_in.heads == stand_in.passes, "a decode pass's head ran in a call of its own"
    assert stand_in.taken > 0, "no claim of the stalled thread was finished by the other"
    model.native_layers = None
    eager = _decode_together(model, 4, threads=2)
    for (tokens_a, a), (tokens_b, b) in zip(team, eager, strict=True):
        assert tokens_a == tokens_b
        assert a.equal(b)


def test_a_float32_models_native_products_with_a_stalled_thread_keep_the_eager_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from radixcache.runtime.model import native_layers

    cfg = tiny_config(**SHAPES)
    model = LlamaModel(cfg, random_weights(cfg, 9))
    _force(model, "native")
    stand_in = _stalled(model, 0)
    team = _decode_together(model, 4, "native", threads=2)
    assert stand_in.passes > 0 and stand_in.taken > 0
    monkeypatch.setattr(native_layers.NativeLayers, "run", lambda self, x, f: None)  # the eager layers
    eager = _decode_together(model, 4, "native", threads=2)
    for (tokens_a, a), (tokens_b, b) in zip(team, eager, strict=True):
        assert tokens_a == tokens_b and a.equal(b)


def test_the_loop_runs_decode_only_team_passes_wide_and_prefill_on_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engine loop -> Scheduler.team_decode_next -> ThreadController.begin_step(wide=...): a prompt's prefill step
    is not wide, its decode-only passes on the native layers' team are, and a float32 model whose plan keeps its
    products off the native kernel never is."""
    from radixcache.runtime import Engine
    from radixcache.runtime.engine.threads import ThreadController

    seen: list[bool] = []
    real = ThreadController.begin_step

    def recorded(self: ThreadController, wide: bool = False) -> int:
        seen.append(wide)
        return real(self, wide)

    monkeypatch.setattr(ThreadController, "begin_step", recorded)
    with Engine(_gguf_model(False), capacity_blocks=64, page_size=8, threads=2) as engine:
        engine.generate([5, 6, 7, 8, 9], max_new_tokens=6, ignore_eos=True)
    assert seen[0] is False and seen[-1] is True and seen.count(True) >= 4
    seen.clear()
    cfg = tiny_config(**SHAPES)
    with Engine(LlamaModel(cfg, random_weights(cfg, 9)), capacity_blocks=64, page_size=8, threads=2) as engine:
        engine.generate([5, 6, 7, 8, 9], max_new_tokens=6, ignore_eos=True)
    assert seen and not any(seen)  # the fixed rules put no product on the native kernel: no team pass


class TeamWayOnly:
    """Stands in for the model's native library: each head-fused pass recorded (torch's thread count on the calling
    thread, the pass's `team` argument) and run decode_team.c's way without stalls (the stalled entry refuses a pass
    that does not fit a team: a team of one, say)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self.seen: list[tuple[int, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def native_decode_step(self, *args: Any) -> int:
        import torch

        self.seen.append((torch.get_num_threads(), args[-1]))
        return self._lib.native_decode_step_stalled(*args, -1, 0, ctypes.byref(ctypes.c_long(0)))


def test_with_the_count_at_one_a_wide_steps_team_runs_on_every_thread_and_torch_on_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A busy machine dropped the loop's count to 1: its decode-only passes still run decode_team.c's way on both
    configured threads, while torch's kernels in those steps (the first one's copy of the prompt's KV into the
    mirror, over a hundred OpenMP regions) run on one (a region on two threads waits at its end for one the machine
    descheduled: that first step took 0.6-1.6 s beside two busy processes). The tokens are an engine's that never
    dropped a thread (fixed at 2)."""
    from radixcache.runtime import Engine
    from radixcache.runtime.engine.threads import ThreadController

    model = _gguf_model(False)
    plan = model.native_layers
    assert plan is not None
    prompt = [5, 6, 7, 8, 9, 10, 11]
    with Engine(model, capacity_blocks=64, page_size=8, threads=2, thread_policy="fixed") as engine:
        expected = engine.generate(prompt, max_new_tokens=8, ignore_eos=True).token_ids
    real = ThreadController.begin_step

    def count_at_one(self: ThreadController, wide: bool = False) -> Any:
        self.threads = 1  # as beside busy processes
        return real(self, wide)

    monkeypatch.setattr(ThreadController, "begin_step", count_at_one)
    stand_in = TeamWayOnly(plan._lib)
    plan._lib = stand_in
    with Engine(model, capacity_blocks=64, page_size=8, threads=2) as engine:
        got = engine.generate(prompt, max_new_tokens=8, ignore_eos=True).token_ids
    assert got == expected
    assert len(stand_in.seen) >= 6 and set(stand_in.seen) == {(1, 2)}


class BarrierLayers:
    """Stands in for the model's native library: every pass the barriers' way (native_decode_step_barriers), the
    way a pass too big for the team's scratch takes, which the suite's small passes never reach otherwise."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self.passes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def native_decode_step(self, *args: Any) -> int:
        self.passes += 1
        return self._lib.native_decode_step_barriers(*args)

    def native_decode_layers(self, *args: Any) -> int:
        return self.native_decode_step(*args[:-1], None, None, None, None, args[-1])  # its team last


@pytest.mark.parametrize("threads", [2, 3])
def test_the_barriers_way_on_several_threads_keeps_the_eager_bits(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    monkeypatch.setenv("RADIXCACHE_GGUF_ACTIVATIONS", "int16")
    model = _gguf_model(True)
    plan = model.native_layers
    assert plan is not None
    stand_in = BarrierLayers(plan._lib)
    plan._lib = stand_in
    barriers = _decode_together(model, 4, threads=threads)
    assert stand_in.passes > 0
    model.native_layers = None
    eager = _decode_together(model, 4, threads=threads)
    for (tokens_a, a), (tokens_b, b) in zip(barriers, eager, strict=True):
        assert tokens_a == tokens_b and a.equal(b)


LATE_US = 20_000  # how long the late helper stays off its core before its first store


def _layer0_stores(args: tuple[Any, ...]) -> list[ctypes.Array[ctypes.c_float]]:
    """What a pass stores for layer 0 (native_decode_layers' arguments): each row's K and V in the pool's slot and
    in the mirror's place, per KV head, as views of that memory."""
    rows, kv_heads, d = args[3], args[6], args[7]
    pool, v_offset, slots = args[14], args[16], ctypes.cast(args[17], ctypes.POINTER(ctypes.c_long))
    mirror_k, mirror_v, row_stride, head_stride = args[19][0], args[20][0], args[21], args[22]
    mirror_rows = ctypes.cast(args[23], ctypes.POINTER(ctypes.c_long))
    mirror_pos = ctypes.cast(args[24], ctypes.POINTER(ctypes.c_long))
    width, f = kv_heads * d, ctypes.sizeof(ctypes.c_float)
    views = []
    for t in range(rows):
        for at in (slots[t] * width, v_offset + slots[t] * width):
            views.append((ctypes.c_float * width).from_address(pool + at * f))
        place = mirror_rows[t] * row_stride + mirror_pos[t] * d
        for base in (mirror_k, mirror_v):
            views += [(ctypes.c_float * d).from_address(base + (place + h * head_stride) * f) for h in range(kv_heads)]
    return views


class LateStore(StalledLayers):
    """The team's way with helper seat 1 off its core for LATE_US just before its first K/V store, while seat 0
    finishes the pass and returns. After each call the K/V the pass stored for layer 0 is zeroed, and must still be
    zero once the late helper has run on (a closed step's helper writes nothing: team_pool.h); then restored."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        super().__init__(lib, 1, -LATE_US)
        self.late = 0  # passes whose helper was inside the step when it stopped

    def native_decode_step(self, *args: Any) -> int:
        self.late += self._stalled_step(args)
        views = _layer0_stores(args[:30])
        saved = [bytes(v) for v in views]
        for v in views:
            ctypes.memset(v, 0, ctypes.sizeof(v))
        time.sleep(3 * LATE_US / 1e6)
        assert all(not any(v) for v in views), "a helper stored K/V after its step had closed"
        for v, b in zip(views, saved, strict=True):
            ctypes.memmove(v, b, len(b))
        return 0


def test_a_helper_late_for_a_closed_step_writes_nothing_and_the_bits_stay() -> None:
    model = _gguf_model(False)
    plan = model.native_layers
    assert plan is not None
    stand_in = LateStore(plan._lib)
    plan._lib = stand_in
    team = _decode_together(model, 4, threads=2)
    assert stand_in.passes > 0 and stand_in.heads == stand_in.passes
    assert stand_in.late == stand_in.passes, "the helper was not inside a step when it stopped"
    model.native_layers = None
    eager = _decode_together(model, 4, threads=2)
    for (tokens_a, a), (tokens_b, b) in zip(team, eager, strict=True):
        assert tokens_a == tokens_b and a.equal(b)
