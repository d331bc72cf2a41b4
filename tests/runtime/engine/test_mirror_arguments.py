"""The decode mirror's argument errors (radixcache.runtime.kv.mirror): `prepare` and `DecodeMirror` refuse bad
arguments, and `model.decode` refuses a step prepared for other lengths.
"""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime.kv.mirror import DecodeMirror
from radixcache.runtime.model.attention import build_decode_meta
from tests.runtime.engine.mirror_twin import CPU, PAGE


def test_prepare_rejects_bad_arguments(models: dict) -> None:
    model = models[torch.float32]
    pool = model.new_pool(8, PAGE)
    mirror = DecodeMirror(model.config, model.dtype, CPU, 1 << 20)
    with pytest.raises(ValueError, match="distinct"):
        mirror.prepare(["a", "a"], [[0], [1]], [3, 4], pool)
    with pytest.raises(ValueError, match="one key, block table and length"):
        mirror.prepare(["a", "b"], [[0]], [3, 4], pool)
    with pytest.raises(ValueError, match="one key, block table and length"):
        mirror.prepare(["a", "b"], [[0], [1]], [3], pool)
    with pytest.raises(ValueError, match="at least one"):
        mirror.prepare([], [], [], pool)
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        DecodeMirror(model.config, model.dtype, CPU, -1)
    assert mirror.nbytes == 0 and mirror.capacity == (0, 0)


def test_decode_rejects_a_step_prepared_for_other_lengths(models: dict) -> None:
    model = models[torch.float32]
    pool = model.new_pool(8, PAGE)
    mirror = DecodeMirror(model.config, model.dtype, CPU, 1 << 20)
    step = mirror.prepare(["a", "b"], [[0], [1]], [3, 5], pool)
    assert step is not None
    meta = build_decode_meta([[0], [1]], [3, 6], PAGE, CPU)
    with pytest.raises(ValueError, match=r"mirror step lengths \(3, 5\) do not match the decode's \(3, 6\)"):
        model.decode([1, 2], meta, pool, step)
    one = build_decode_meta([[0]], [3], PAGE, CPU)
    with pytest.raises(ValueError, match="do not match"):
        model.decode([1], one, pool, step)


@pytest.mark.parametrize(
    ("lengths", "tables"), [([0], [[0]]), ([-2], [[0]]), ([3, 0], [[0], [1]]), ([PAGE + 1], [[0]])]
)
def test_prepare_refuses_a_length_outside_its_table_before_any_row_moves(
    models: dict, lengths: list[int], tables: list[list[int]]
) -> None:
    """Length 0 put the new token at position -1 (the row's last, by wrap-around) and returned a step; a table short
    of the context failed with a reshape error inside a row's fill. Both are refused, and the rows already there
    (here "a", synced at 3) stay as they were."""
    model = models[torch.float32]
    pool = model.new_pool(8, PAGE)
    mirror = DecodeMirror(model.config, model.dtype, CPU, 1 << 20)
    first = mirror.prepare(["a"], [[2]], [3], pool)
    assert first is not None
    mirror.commit(first)
    before = [t.clone() for t in first.k]
    keys = [f"s{i}" for i in range(len(lengths))]
    with pytest.raises(ValueError, match=f"a decode length must be 1 to its table's .* positions, got {lengths[-1]}"):
        mirror.prepare(keys, tables, lengths, pool)
    assert mirror._keys == ["a"] and mirror._synced == [3]
    assert all(torch.equal(a, b) for a, b in zip(before, mirror._k, strict=True))
