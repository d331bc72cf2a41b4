"""The decode mirror's attention (`MirrorStep.attend`, radixcache.runtime.kv.mirror) against a naive float64 softmax
attention over the pool's K/V read slot by slot (KV heads repeated in the reference only), for batches of
different lengths whose rows are not in batch order, and on the first step of every sequence.
"""

from __future__ import annotations

import random

import pytest
import torch

from radixcache.runtime.kv.mirror import DecodeMirror
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.testing import tiny_config
from tests.runtime.engine.mirror_twin import CPU, MODEL, naive_attention, read_sequence


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 4), (8, 2)])
@pytest.mark.parametrize("same_lengths", [False, True])
def test_attend_equals_naive_attention_over_rows_out_of_batch_order(
    dtype: torch.dtype, heads: int, kv_heads: int, same_lengths: bool
) -> None:
    config = tiny_config(num_heads=heads, num_kv_heads=kv_heads, head_dim=8)
    g = torch.Generator().manual_seed(3)
    pool = KVPool(config, 64, 4, dtype=dtype)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=g, dtype=torch.float64))
    mirror = DecodeMirror(config, dtype, CPU, 1 << 30)
    tables = {key: random.Random(key).sample(range(64), 12) for key in "abcd"}
    first = {"a": 7, "b": 30, "c": 1, "d": 20} if not same_lengths else dict.fromkeys("abcd", 13)
    # Step 1 puts a, b, c in rows 0, 1, 2 and writes their position n - 1 as a forward would (the pool's
    # values, which stand for what the forward wrote there too); step 2 asks for d, c, a, b: rows 3, 2, 0, 1.
    step1 = mirror.prepare(list("abc"), [tables[k] for k in "abc"], [first[k] for k in "abc"], pool)
    assert step1 is not None and step1.order is None and step1.inverse is None
    for layer in range(config.num_layers):
        last = [read_sequence(pool, layer, tables[k], first[k]) for k in "abc"]
        step1.write(layer, torch.stack([k[-1] for k, _ in last]), torch.stack([v[-1] for _, v in last]))
    mirror.commit(step1)
    keys = list("dcab")
    lengths = [first[k] + 1 for k in keys]  # d joins; a..c grew by the token decoded in step 1
    step = mirror.prepare(keys, [tables[k] for k in keys], lengths, pool)
    assert step is not None and step.rows == (3, 2, 0, 1)
    assert step.order is not None and step.inverse is not None
    assert (step.mask is None) == same_lengths
    assert mirror.positions_loaded == sum(first[k] - 1 for k in "abc") + first["d"]
    for layer in range(config.num_layers):
        q = torch.randn(4, heads, 8, generator=g, dtype=torch.float64).to(dtype)
        k_new = torch.randn(4, kv_heads, 8, generator=g, dtype=torch.float64).to(dtype)
        v_new = torch.randn(4, kv_heads, 8, generator=g, dtype=torch.float64).to(dtype)
        step.write(layer, k_new, v_new)
        out = step.attend(layer, q)
        assert out.shape == (4, heads, 8) and out.dtype == dtype
        for i, (key, n) in enumerate(zip(keys, lengths, strict=True)):
            k_seq, v_seq = read_sequence(pool, layer, tables[key], n - 1)
            k_all = torch.cat([k_seq, k_new[i : i + 1]])
            v_all = torch.cat([v_seq, v_new[i : i + 1]])
            want = naive_attention(q[i], k_all, v_all)
            err = (out[i].double() - want).abs().max().item()
            assert err < (1e-5 if dtype == torch.float32 else 1e-12), (key, layer, err)


def test_attend_on_the_first_step_of_every_sequence_reads_only_the_pool() -> None:
    """Rows filled from the pool in one step (no earlier commit), lengths all different, batch order kept."""
    config = MODEL.config
    pool = KVPool(config, 32, 4)
    pool.kv.normal_(generator=torch.Generator().manual_seed(5))
    mirror = DecodeMirror(config, torch.float32, CPU, 1 << 30)
    tables = [[3, 9, 1], [0], [31, 30, 29, 28, 2]]
    lengths = [10, 2, 17]
    step = mirror.prepare(["x", "y", "z"], tables, lengths, pool)
    assert step is not None and step.order is None and step.mask is not None
    g = torch.Generator().manual_seed(6)
    for layer in range(config.num_layers):
        q = torch.randn(3, config.num_heads, config.head_dim, generator=g)
        k_new = torch.randn(3, config.num_kv_heads, config.head_dim, generator=g)
        v_new = torch.randn(3, config.num_kv_heads, config.head_dim, generator=g)
        step.write(layer, k_new, v_new)
        out = step.attend(layer, q)
        for i, (table, n) in enumerate(zip(tables, lengths, strict=True)):
            k_seq, v_seq = read_sequence(pool, layer, table, n - 1)
            want = naive_attention(q[i], torch.cat([k_seq, k_new[i : i + 1]]), torch.cat([v_seq, v_new[i : i + 1]]))
            assert (out[i].double() - want).abs().max().item() < 1e-5
