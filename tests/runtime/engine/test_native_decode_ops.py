"""radixcache.runtime.native.ops, the native RMSNorm and decode attention of quant="gguf": the norm against a float64
RMSNorm and against PyTorch's `rms_norm` fallback (which must serve every input the native one does not take),
and decode through a mirror whose attention is native against the same decode through a mirror in PyTorch, on the
tiny model, over steps where sequences of different lengths join, leave and come in another order."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from radixcache.runtime.kv.mirror import DecodeMirror
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel, rms_norm
from radixcache.runtime.native.ops import NativeDecodeOps
from radixcache.runtime.testing import tiny_model

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the native kernels need a C compiler"
)


@pytest.fixture(scope="module")
def ops() -> NativeDecodeOps:
    return NativeDecodeOps()


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_native_rms_norm_equals_a_float64_rms_norm(ops: NativeDecodeOps, rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 576, generator=g) * 2, torch.randn(576, generator=g)
    got = ops.rms_norm(x, w, 1e-5, rms_norm)
    xd = x.double()
    want = w.double() * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("what", "x"),
    [
        ("more rows than the native path takes", torch.randn(5, 64)),
        ("float64", torch.randn(2, 64, dtype=torch.float64)),
        ("a 3-D input", torch.randn(2, 2, 64)),
    ],
)
def test_what_the_native_norm_does_not_take_goes_to_the_fallback(
    ops: NativeDecodeOps, what: str, x: torch.Tensor
) -> None:
    w = torch.randn(64, dtype=x.dtype)
    assert torch.equal(ops.rms_norm(x, w, 1e-5, rms_norm), rms_norm(x, w, 1e-5)), what


def test_a_strided_norm_weight_gives_the_fallbacks_values_and_a_short_one_its_error(ops: NativeDecodeOps) -> None:
    """The kernel reads C contiguous weights: a strided view gave another weight's values, a short one read past it."""
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(2, 64, generator=g), torch.randn(128, generator=g)[::2]
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5, rms_norm), rms_norm(x, w, 1e-5), rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="size of tensor"):
        ops.rms_norm(x, torch.randn(3), 1e-5, rms_norm)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("float64 queries", "float32 CPU queries"),
        ("float64 values", "float32 CPU queries"),
        ("head size 16 against 8", "head size 16 cannot attend to keys of head size 8"),
        ("rows not dense per head", "dense per head"),
        ("one length for two queries", "2 queries need 2 lengths, got 1"),
    ],
)
def test_decode_attention_refuses_what_it_would_misread(ops: NativeDecodeOps, case: str, message: str) -> None:
    """Each of these returned an answer from misread memory (or zero-filled lengths) before the wrapper checked."""
    g = torch.Generator().manual_seed(8)
    q, k, v = torch.randn(2, 4, 8, generator=g), torch.randn(2, 2, 16, 8, generator=g), torch.randn(2, 2, 16, 8)
    lengths = [3, 5]
    if case == "float64 queries":
        q = q.double()
    elif case == "float64 values":
        v = v.double()
    elif case.startswith("head size"):
        q = torch.randn(2, 4, 16)
    elif case == "rows not dense per head":
        k, v = torch.randn(2, 2, 8, 8).transpose(2, 3), torch.randn(2, 2, 8, 8).transpose(2, 3)
    else:
        lengths = [3]
    with pytest.raises(ValueError, match=message):
        ops.attend(q, k, v, lengths)


def test_decode_through_a_native_mirror_equals_decode_through_a_pytorch_mirror(ops: NativeDecodeOps) -> None:
    """Two pools with the same KV; mirror A attends natively, mirror B in PyTorch; steps with different lengths
    (the native kernel takes them; PyTorch masks), a sequence leaving and the rest coming in another order."""
    m = tiny_model(seed=3)
    model = LlamaModel(m.config, m.weights)
    page, lengths = 16, {"a": 37, "b": 5, "c": 70}
    pools = (model.new_pool(64, page), model.new_pool(64, page))
    tables = {"a": list(range(0, 8)), "b": list(range(8, 16)), "c": list(range(16, 24))}
    g = torch.Generator().manual_seed(0)
    for key, n in lengths.items():
        prompt = torch.randint(1, 97, (n - 1,), generator=g).tolist()
        for pool in pools:
            model.prefill(prompt, 0, tables[key], pool)
    native = DecodeMirror(model.config, model.dtype, "cpu", 1 << 30, native=ops)
    plain = DecodeMirror(model.config, model.dtype, "cpu", 1 << 30)
    for step, keys in enumerate([["a", "b", "c"], ["a", "b", "c"], ["c", "a"], ["c", "a", "b"]]):
        lens = [lengths[k] for k in keys]
        tbl = [tables[k] for k in keys]
        meta = build_decode_meta(tbl, lens, page, model.device)
        tokens = torch.randint(1, 97, (len(keys),), generator=g).tolist()
        outs = []
        for mirror, pool in ((native, pools[0]), (plain, pools[1])):
            rows = mirror.prepare(keys, tbl, lens, pool)
            assert rows is not None
            outs.append(model.decode(tokens, meta, pool, rows))
            mirror.commit(rows)
        scale = max(1.0, outs[1].abs().max().item())
        err = (outs[0] - outs[1]).abs().max().item()
        assert err <= 1e-5 * scale, f"step {step} ({keys}): native vs PyTorch attention differ by {err}"
        for k in keys:
            lengths[k] += 1


@pytest.mark.parametrize("lengths", [[1], [600], [128, 129, 2000], [5, 700, 64, 1]])
def test_native_decode_attention_gives_the_same_bits_on_any_thread_count(
    ops: NativeDecodeOps, lengths: list[int]
) -> None:
    """Its work is split by position spans fixed by the lengths, never by the thread count, and merged in position
    order: the engine changes its thread count with the machine's load, and a greedy answer must not change. The
    threads' runs of items are cut by positions: 3 and 5 threads cut them elsewhere than 2 (5 threads over [1]'s 3
    items leave some threads none)."""
    g = torch.Generator().manual_seed(len(lengths))
    cap = max(lengths)
    keys, values = torch.randn(2, len(lengths), 3, cap, 64, generator=g).unbind(0)
    q = torch.randn(len(lengths), 9, 64, generator=g) * 3
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3, 5, 1):
            torch.set_num_threads(threads)
            outs.append(ops.attend(q, keys, values, lengths))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], out) for out in outs[1:])
