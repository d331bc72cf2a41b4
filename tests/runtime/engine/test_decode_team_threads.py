"""runtime/native/team_pool.c through real decode steps: engines on three threads at once share one GGUF-block model
(one NativeLayers plan, one process-wide pool of helper threads), each on its own thread count (2 to 4 seats on a
machine of 2 cores), with helpers made late on some steps (after their claims, or before their first K/V store
while the step closes); every engine's tokens and logits are the eager layers' bits, and the model dropped right
after (its plan waiting for no helper inside a step) leaves the next model's steps whole."""

from __future__ import annotations

import ctypes
import gc
import os
import random
import shutil
import threading
from typing import Any

import pytest

from tests.runtime.engine.test_native_layers import _decode_together, _gguf_model

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the native kernels need a C compiler"
)

STALLS = (200, 2000, -3000)  # microseconds: after each claim (> 0), or before the first store, late (< 0)


class SometimesLate:
    """Stands in for the model's native library: a third of the steps go the team's way with a random helper seat
    late (native_decode_step_stalled), the others as the plan calls them."""

    def __init__(self, lib: ctypes.CDLL, seed: int) -> None:
        self._lib, self._rng, self._guard = lib, random.Random(seed), threading.Lock()
        self.stalled = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def native_decode_step(self, *args: Any) -> int:
        with self._guard:  # the generator is shared by the engines' threads
            late, seat, stall = self._rng.random() < 1 / 3, self._rng.randint(1, 3), self._rng.choice(STALLS)
        if late:
            taken = ctypes.c_long(0)
            if self._lib.native_decode_step_stalled(*args, seat, stall, ctypes.byref(taken)) == 0:
                self.stalled += 1
                return 0
        return self._lib.native_decode_step(*args)

    def native_decode_layers(self, *args: Any) -> int:
        return self.native_decode_step(*args[:-1], None, None, None, None, args[-1])  # its team last


def _decode(model: Any, results: dict[int, Any], i: int, rows: int, threads: int) -> None:
    results[i] = _decode_together(model, rows, threads=threads)


def test_engines_on_three_threads_sharing_a_model_keep_the_eager_bits_with_late_helpers() -> None:
    eager_model = _gguf_model(False)
    eager_model.native_layers = None
    eager = {rows: _decode_together(eager_model, rows, threads=2) for rows in (2, 3)}
    for round_ in range(2):
        model = _gguf_model(False)
        plan = model.native_layers
        assert plan is not None
        stand_in = SometimesLate(plan._lib, seed=round_)
        plan._lib = stand_in
        jobs = [(2, 2), (3, 3), (2, 4)]  # (rows, the engine's threads)
        results: dict[int, Any] = {}

        workers = [threading.Thread(target=_decode, args=(model, results, i, *job)) for i, job in enumerate(jobs)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert sorted(results) == [0, 1, 2], "an engine's thread did not finish"
        assert stand_in.stalled > 0
        for i, (rows, _) in enumerate(jobs):
            for (tokens_a, a), (tokens_b, b) in zip(results[i], eager[rows], strict=True):
                assert tokens_a == tokens_b and a.equal(b)
        del model, plan, stand_in, workers
        gc.collect()  # the plan waits for no helper inside a step (native_team_quiesce), then its weights go
