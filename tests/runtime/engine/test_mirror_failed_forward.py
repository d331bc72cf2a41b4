"""A forward that raises mid-way (in the mirror's attention or in a layer) leaves the decode mirror
(radixcache.runtime.kv.mirror) usable: the next steps still equal the paged path, whether the same batch retries,
one sequence leaves or one joins.
"""

from __future__ import annotations

import pytest
import torch

from tests.runtime.engine.mirror_twin import Twin, failing_attend, failing_layer, ids


@pytest.mark.parametrize("where", ["attend-0", "attend-1", "layer-0", "layer-1"])
@pytest.mark.parametrize("then", ["retry", "one-leaves", "one-joins"])
def test_a_forward_that_raises_mid_way_leaves_no_corrupted_state(models: dict, where: str, then: str) -> None:
    model = models[torch.float32]
    twin = Twin(model)
    twin.join("a", ids(12, 17))
    twin.join("b", ids(26, 18))
    twin.join("c", ids(3, 19))
    for _ in range(2):
        twin.step(["c", "a", "b"])
    kind, index = where.split("-")
    ctx = failing_attend(int(index)) if kind == "attend" else failing_layer(model, int(index))
    with ctx, pytest.raises(RuntimeError, match="injected"):
        twin.mirrored(["b", "c", "a"])
    keys = ["b", "c", "a"]
    if then == "one-leaves":
        twin.leave("c")
        keys = ["a", "b"]
    elif then == "one-joins":
        twin.join("d", ids(8, 20))
        keys = ["d", "a", "b", "c"]
    for _ in range(3):
        twin.step(keys)  # asserts mirror logits == paged logits
