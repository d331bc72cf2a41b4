"""The decode mirror (radixcache.runtime.kv.mirror) changes nothing but where decode attention reads its KV.

`model.decode` with a mirror step against `model.decode` without one (the paged gather and in-place runs paths) on a
second pool that holds the same sequences in other pages, over schedules where sequences join, leave, grow past
the 256-position growth step and shrink the batch, in float32 and float64, for other head layouts, and a
hypothesis property over random join / leave / step / fail / re-key schedules and budgets.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.testing import tiny_model
from tests.runtime.engine.mirror_twin import Twin, assert_close, failing_layer, ids, llama


def run_schedule(twin: Twin) -> list[tuple[int, int]]:
    """Join, grow past 256 positions, shuffle the batch order, leave, shrink, join again. Returns the mirror's
    capacity after every step."""
    caps = []
    order = random.Random(2)

    def steps(n: int) -> None:
        for _ in range(n):
            keys = list(twin.seqs)
            order.shuffle(keys)
            assert twin.step(keys) is not None
            caps.append(twin.mirror.capacity)

    twin.join("a", ids(5, 1))
    twin.join("b", ids(40, 2))
    steps(3)
    twin.join("c", ids(250, 3))  # crosses 256 positions after 7 more steps
    twin.join("d", ids(1, 4))  # a first token: nothing to load
    twin.join("e", ids(17, 5))
    steps(9)
    twin.leave("b")
    twin.leave("d")
    steps(2)
    twin.leave("a")
    twin.leave("e")
    steps(3)  # c alone: 1 row of 512 where 8 were allocated, so the mirror shrinks
    twin.join("f", ids(3, 6))
    steps(3)
    return caps


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decode_through_the_mirror_equals_the_paged_paths_over_a_schedule(models: dict, dtype: torch.dtype) -> None:
    twin = Twin(models[dtype])
    caps = run_schedule(twin)  # every step asserts equal logits
    assert caps[0] == (2, 256)
    assert (8, 256) in caps and (8, 512) in caps, "the span must grow past 256 with 5 rows"
    assert (1, 512) in caps, "the batch must shrink to one row"
    assert caps[-1] == (2, 512)
    assert twin.mirror.reallocations >= 4


@pytest.mark.parametrize(
    "variant",
    [{"arch": "qwen2", "attention_bias": True}, {"tie_embeddings": True, "num_kv_heads": 4}, {"num_heads": 8}],
    ids=["qwen2-bias", "mha", "gqa4"],
)
def test_decode_through_the_mirror_equals_the_paged_paths_for_other_head_layouts(variant: dict) -> None:
    m = tiny_model(seed=11, **variant)
    twin = Twin(LlamaModel(m.config, m.weights))
    twin.join(0, ids(30, 7))
    twin.join(1, ids(9, 8))
    for i in range(4):
        twin.step([1, 0] if i % 2 else [0, 1])
    twin.join(2, ids(2, 9))
    for _ in range(3):
        twin.step([2, 0, 1])


PROMPT_LENGTHS = [1, 2, 15, 16, 17, 64, 200, 255, 256, 257, 300]
PROPERTY_MODEL = llama()
ROW = 256 * 2 * 2 * 2 * 8 * 4  # bytes of one row of 256 positions of the tiny model in float32
ops = st.lists(
    st.tuples(st.sampled_from(["join", "leave", "step", "fail", "nocommit", "rekey"]), st.integers(0, 10**6)),
    min_size=1,
    max_size=14,
)


@settings(max_examples=25, deadline=None)
@given(ops=ops, budget=st.sampled_from([1 << 30, 2 * ROW, 4 * ROW]))
def test_any_schedule_of_steps_gives_the_paged_logits(ops: list[tuple[str, int]], budget: int) -> None:
    model = PROPERTY_MODEL
    twin = Twin(model, max_bytes=budget)
    fresh = iter(range(10**9))
    for op, x in ops:
        keys = list(twin.seqs)
        random.Random(x).shuffle(keys)
        if op == "join" and len(keys) < 5:
            twin.join(next(fresh), ids(PROMPT_LENGTHS[x % len(PROMPT_LENGTHS)], x))
        elif op == "leave" and keys:
            twin.leave(keys[0])
        elif op == "rekey" and keys:
            twin.rekey(keys[0], next(fresh))
        elif op == "fail" and keys:
            with failing_layer(model, x % model.config.num_layers), pytest.raises(RuntimeError, match="injected"):
                twin.mirrored(keys)
        elif op == "nocommit" and keys:
            got, _ = twin.mirrored(keys, commit=False)
            want = twin.paged(keys)
            assert_close(got, want, model.dtype, "uncommitted step")
            twin.advance(keys)
        elif keys:
            want_rows = 1 << (len(keys) - 1).bit_length()
            want_span = -(-max(twin.lengths(keys)) // 256) * 256
            step = twin.step(keys)
            assert (step is None) == (want_rows * want_span * twin.mirror.bytes_per_position > budget)
        assert twin.mirror.nbytes <= budget
        for k in [k for k, s in twin.seqs.items() if len(s.ids) >= model.config.max_position]:
            twin.leave(k)
    if twin.seqs:
        twin.step(list(twin.seqs))
