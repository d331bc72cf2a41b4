"""The decode mirror (radixcache.runtime.kv.mirror) copies no KV per step: `positions_loaded` grows by n - 1 when a
sequence of length n joins and never on later steps (a reallocation moves rows, it loads nothing); a new key
(preemption), a step never committed and a step that raised are refilled from the pool, and nothing else is.
"""

from __future__ import annotations

import pytest
import torch

from tests.runtime.engine.mirror_twin import Twin, failing_attend, ids


def test_rows_are_filled_once_per_join_and_refilled_after_rekey_or_a_failed_step(models: dict) -> None:
    twin = Twin(models[torch.float32])
    m = twin.mirror
    twin.join("a", ids(10, 11))
    twin.join("b", ids(1, 12))
    twin.step(["a", "b"])
    assert m.positions_loaded == 9 + 0
    for _ in range(3):
        twin.step(["b", "a"])
    assert m.positions_loaded == 9, "sequences in sync are never copied again"
    twin.join("c", ids(250, 13))
    twin.step(["a", "c", "b"])
    assert m.positions_loaded == 9 + 249
    for _ in range(8):  # the span passes 256: the reallocation moves the rows, it loads nothing from the pool
        twin.step(["c", "a", "b"])
    assert m.capacity[1] == 512 and m.positions_loaded == 9 + 249
    twin.rekey("a", ("a", 1))  # preempted and back: same content, new key, refilled
    n_a = len(twin.seqs["a", 1].ids)
    twin.step([("a", 1), "b", "c"])
    assert m.positions_loaded == 9 + 249 + n_a - 1
    before = m.positions_loaded
    twin.mirrored(["b", "c"], commit=False)  # the forward ran, but the step was never committed
    want_b_c = sum(n - 1 for n in twin.lengths(["b", "c"]))
    twin.step(["b", "c"])  # a left; the same positions again
    assert m.positions_loaded == before + want_b_c
    twin.step(["b", "c"])
    assert m.positions_loaded == before + want_b_c


def test_a_step_that_raised_is_refilled_and_nothing_else_is(models: dict) -> None:
    twin = Twin(models[torch.float32])
    twin.join("a", ids(20, 14))
    twin.join("b", ids(33, 15))
    twin.step(["a", "b"])
    loaded = twin.mirror.positions_loaded
    with failing_attend(at_call=1), pytest.raises(RuntimeError, match="injected"):
        twin.mirrored(["a", "b"])
    twin.join("c", ids(4, 16))
    lengths = twin.lengths(["a", "b", "c"])
    twin.step(["a", "b", "c"])
    assert twin.mirror.positions_loaded == loaded + sum(n - 1 for n in lengths)
    twin.step(["a", "b", "c"])
    assert twin.mirror.positions_loaded == loaded + sum(n - 1 for n in lengths)
