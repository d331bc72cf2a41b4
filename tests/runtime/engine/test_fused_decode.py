"""runtime.model.fused_decode and runtime/native/decode_store.c: a decode pass's RoPE and K/V stores in one native
call must give the same bits as the eager layer (PyTorch's RoPE expression, the pool's index_copy_, the mirror's
copies), refuse indices out of range before writing anything, and leave whole decodes unchanged: an engine with
the fused path and one without it decode the same tokens and logits while requests join and leave mid-decode
(to 1e-5: the runs' batches differ with arrival instants, and a product's bits may follow its row count)."""

from __future__ import annotations

import os
import shutil
import threading

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.model import fused_decode
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.model.rope import _rope_signed
from radixcache.runtime.native.ops import NativeDecodeOps
from radixcache.runtime.testing import RandomModel, tiny_model

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the native kernels need a C compiler"
)
H, KV, D = 9, 3, 64


@pytest.fixture(scope="module")
def ops() -> NativeDecodeOps:
    return NativeDecodeOps()


def _tables(max_position: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    emb = torch.outer(torch.arange(max_position, dtype=torch.float64), inv).repeat(1, 2)
    cos, sin = emb.cos().float(), emb.sin().float()
    return cos, torch.cat((-sin[:, : D // 2], sin[:, D // 2 :]), dim=-1)


def _case(rows: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "qkv": torch.randn(rows, (H + 2 * KV) * D, generator=g) * 3,
        "positions": torch.randint(0, 2048, (rows,), generator=g),
        "slots": torch.randperm(8 * 16, generator=g)[:rows],
        "mirror_rows": torch.randperm(6, generator=g)[:rows],
        "mirror_pos": torch.randint(0, 40, (rows,), generator=g),
    }


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_rope_store_gives_the_eager_layers_bits(ops: NativeDecodeOps, rows: int) -> None:
    c = _case(rows, rows)
    cos, ssin = _tables()
    pool = torch.randn(2, 8, 16, KV, D)  # one layer's K and V pages
    mirror = torch.randn(2, 6, KV, 40, D)
    want_pool, want_mirror = pool.clone(), mirror.clone()

    q = ops.rope_store(
        c["qkv"], H, c["positions"], (cos, ssin), (pool[0], pool[1]), c["slots"], (mirror[0], mirror[1]),
        (c["mirror_rows"], c["mirror_pos"]),
    )  # fmt: skip

    qk = _rope_signed(c["qkv"][:, : (H + KV) * D].reshape(rows, H + KV, D), cos[c["positions"]].unsqueeze(1),
                      ssin[c["positions"]].unsqueeze(1))  # fmt: skip
    k, v = qk[:, H:], c["qkv"][:, (H + KV) * D :].reshape(rows, KV, D)
    want_pool.view(2, -1, KV, D)[0].index_copy_(0, c["slots"], k)
    want_pool.view(2, -1, KV, D)[1].index_copy_(0, c["slots"], v)
    want_mirror[0][c["mirror_rows"], :, c["mirror_pos"]] = k
    want_mirror[1][c["mirror_rows"], :, c["mirror_pos"]] = v
    assert torch.equal(q, qk[:, :H])
    assert torch.equal(pool, want_pool)
    assert torch.equal(mirror, want_mirror)


@pytest.mark.parametrize(
    ("what", "field", "value"),
    [
        ("a position past the tables", "positions", 2048),
        ("a negative position", "positions", -1),
        ("a slot past the pool", "slots", 128),
        ("a mirror row past the rows", "mirror_rows", 6),
        ("a mirror position past its capacity", "mirror_pos", 40),
    ],
)
def test_rope_store_refuses_an_index_out_of_range_and_writes_nothing(
    ops: NativeDecodeOps, what: str, field: str, value: int
) -> None:
    c = _case(3, 7)
    c[field][2] = value  # the last row: rows before it would have been written by a kernel that checked late
    pool, mirror = torch.randn(2, 8, 16, KV, D), torch.randn(2, 6, KV, 40, D)
    before = (pool.clone(), mirror.clone())
    with pytest.raises(ValueError, match="native_rope_store refused"):
        ops.rope_store(
            c["qkv"], H, c["positions"], _tables(), (pool[0], pool[1]), c["slots"], (mirror[0], mirror[1]),
            (c["mirror_rows"], c["mirror_pos"]),
        )  # fmt: skip
    assert torch.equal(pool, before[0]) and torch.equal(mirror, before[1]), what


def test_a_pass_with_chunks_or_without_a_mirror_takes_the_eager_layer() -> None:
    m = tiny_model(seed=1)
    model = LlamaModel(m.config, m.weights)
    pool = model.new_pool(8, 16)
    assert fused_decode.FusedDecode.build(model, pool, None, 1) is None
    model.native = None
    assert fused_decode.FusedDecode.build(model, pool, None, 0) is None


def _run(engine: Engine) -> list[tuple[list[int], torch.Tensor]]:
    """Requests that arrive while others decode (and leave before them), greedy, with their logits."""
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(1, 97, (n,), generator=g).tolist() for n in (40, 7, 90, 23)]
    first = engine.submit(prompts[0], 30, ignore_eos=True, return_logits=True)
    started = threading.Event()
    later = []
    for i, p in enumerate(prompts[1:]):
        while len(engine.scheduler.decoding) == 0 and not first.done():  # wait until something decodes
            started.wait(0.001)
        later.append(engine.submit(p, 6 + 8 * i, ignore_eos=True, return_logits=True))
    results = [first.result(60), *(h.result(60) for h in later)]
    return [(list(r.token_ids), torch.stack(list(r.logits))) for r in results]


def test_an_engine_decodes_the_same_with_and_without_the_fused_step(
    tiny: RandomModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = NativeDecodeOps.rope_store

    def counted(self: NativeDecodeOps, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(NativeDecodeOps, "rope_store", counted)
    with Engine(tiny, capacity_blocks=64, page_size=16, threads=1, thread_policy="fixed") as engine:
        fused = _run(engine)
    assert calls, "the fused step never ran"
    monkeypatch.setattr(fused_decode.FusedDecode, "build", classmethod(lambda cls, *a: None))
    with Engine(tiny, capacity_blocks=64, page_size=16, threads=1, thread_policy="fixed") as engine:
        eager = _run(engine)
    for (tokens_a, a), (tokens_b, b) in zip(fused, eager, strict=True):
        assert tokens_a == tokens_b
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
