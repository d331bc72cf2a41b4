"""The decode mirror's memory bound (radixcache.runtime.kv.mirror): past `max_bytes` `prepare` returns None and frees
the mirror, and the next step under the budget refills it; an Engine with a small `mirror_memory` gives the tokens
of `mirror_memory=0` and of the default; and how the Engine reads `mirror_memory`.
"""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.kv.mirror import DecodeMirror, MirrorStep
from radixcache.runtime.testing import RandomModel
from tests.runtime.engine.mirror_twin import CPU, Twin, assert_same_results, ids, run_together


def test_prepare_past_max_bytes_returns_none_and_frees_the_mirror(models: dict) -> None:
    model = models[torch.float32]
    per_row = 256 * DecodeMirror(model.config, model.dtype, CPU, 0).bytes_per_position  # one row of 256 positions
    twin = Twin(model, max_bytes=2 * per_row)
    m = twin.mirror
    assert m.bytes_per_position == 2 * 2 * 2 * 8 * 4
    twin.join("a", ids(9, 21))
    twin.join("b", ids(14, 22))
    assert twin.step(["a", "b"]) is not None
    assert m.nbytes == 2 * per_row
    twin.join("c", ids(5, 23))
    assert twin.step(["a", "b", "c"]) is None  # 4 rows wanted: over the budget, the paged paths ran
    assert m.nbytes == 0 and m.capacity == (0, 0)
    twin.leave("c")
    loaded = m.positions_loaded
    lengths = twin.lengths(["b", "a"])
    assert twin.step(["b", "a"]) is not None  # back under the budget: both rows refilled
    assert m.positions_loaded == loaded + sum(n - 1 for n in lengths)
    twin.join("d", ids(250, 24))
    twin.leave("a")
    twin.leave("b")
    for _ in range(5):
        assert twin.step(["d"]) is not None  # one row of 256
    assert m.capacity == (2, 256), "within twice what the batch needs, the allocation is kept"
    for _ in range(3):
        assert twin.step(["d"]) is not None  # one row of 512: the whole budget
    assert m.capacity == (1, 512) and m.nbytes <= m.max_bytes
    tight = Twin(model, max_bytes=per_row - 1)
    tight.join("x", ids(3, 25))
    assert tight.step(["x"]) is None and tight.mirror.nbytes == 0


def test_an_engine_with_a_small_mirror_budget_gives_the_same_tokens(tiny: RandomModel) -> None:
    prompts = [ids(240, 30), ids(7, 31), ids(60, 32), ids(19, 33)]
    max_new = [24, 4, 8, 12]  # the batch shrinks from 4 to 1; the first crosses 256 positions
    small = Engine(tiny, capacity_blocks=128, page_size=8, mirror_memory=150_000)  # up to 2 rows of 256
    assert small.mirror is not None and small.mirror.max_bytes == 150_000
    stepped: list[bool] = []
    prepare = small.mirror.prepare

    def recording(*args: object) -> MirrorStep | None:
        step = prepare(*args)  # type: ignore[arg-type]
        stepped.append(step is not None)
        assert small.mirror is not None and small.mirror.nbytes <= 150_000
        return step

    small.mirror.prepare = recording  # type: ignore[method-assign]
    got = run_together(small, prompts, max_new)
    off = run_together(Engine(tiny, capacity_blocks=128, page_size=8, mirror_memory=0), prompts, max_new)
    default = Engine(tiny, capacity_blocks=128, page_size=8)
    on = run_together(default, prompts, max_new)
    assert_same_results(got, off)
    assert_same_results(on, off)
    assert False in stepped and True in stepped, "both the paged and the mirror paths must have run"
    assert default.mirror is not None and default.mirror.positions_loaded > 0


def test_engine_mirror_memory_settings(tiny: RandomModel) -> None:
    assert Engine(tiny, capacity_blocks=16, mirror_memory=0).mirror is None
    default = Engine(tiny, capacity_blocks=16)
    assert isinstance(default.mirror, DecodeMirror) and default.mirror.max_bytes == 512 * 2**20
    for memory, want in (("64MiB", 64 * 2**20), (4096, 4096)):
        mirror = Engine(tiny, capacity_blocks=16, mirror_memory=memory).mirror
        assert mirror is not None and mirror.max_bytes == want
    with pytest.raises(ValueError, match="cannot parse memory budget"):
        Engine(tiny, capacity_blocks=16, mirror_memory="lots")
    with pytest.raises(ValueError, match="must be positive"):
        Engine(tiny, capacity_blocks=16, mirror_memory=-5)
