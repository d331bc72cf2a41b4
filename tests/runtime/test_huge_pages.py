"""runtime.huge_pages and the model's use of it: a placed tensor equals its source in dtype, shape and every value,
starts 4 KiB-aligned in a chunk that starts on a 2 MiB boundary, and chunks come as the expected size says; on a
Linux whose transparent huge pages are not "never", the placed bytes really are huge pages (the process's own
/proc/self/smaps says so). A float32 model built with huge weights gives the same logits, bit for bit, as one built
without (tied head or not) and holds its streamed matrices apart from the caller's tensors; GGUF blocks and small
models keep their weights where they are."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys

import pytest
import torch

from radixcache.runtime.huge_pages import HUGE_PAGE_BYTES, HugePageArena, aligned_huge, huge_pages
from radixcache.runtime.model import llama_weights
from radixcache.runtime.model.block_linear import BlockLinear
from radixcache.runtime.model.linear import DenseLinear
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.testing import random_block_weight, random_weights, tiny_config

_THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def _thp_allowed() -> bool:
    """Whether this Linux hands out transparent huge pages to memory that asks (the bracketed mode of `_THP`)."""
    try:
        with open(_THP, encoding="ascii") as f:
            mode = f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return False
    return mode in ("always", "madvise")


def _vmstat(name: str) -> int:
    """A counter of /proc/vmstat (0 where it is missing)."""
    with open("/proc/vmstat", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    return 0


def _huge_kb_at(address: int) -> int:
    """AnonHugePages (kB) of the mapping that holds `address`, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8, torch.float64])
def test_a_placed_tensor_equals_its_source_and_is_aligned(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    sources = [(torch.randn(shape, generator=g) * 50).to(dtype) for shape in [(7, 13), (1,), (300, 1000), (0, 4)]]
    arena = HugePageArena(HugePageArena.room([t.numel() * t.element_size() for t in sources]))
    placed = [arena.place(t) for t in sources]
    for src, out in zip(sources, placed, strict=True):
        assert out.dtype == src.dtype and out.shape == src.shape and out.is_contiguous()
        assert torch.equal(out, src)
        assert out.numel() == 0 or out.data_ptr() % 4096 == 0
        assert out.numel() == 0 or out.data_ptr() != src.data_ptr()
    assert arena.chunks == 1  # room() was enough
    placed[0].add_(1)  # views of one chunk, but apart: writing one changes no other
    assert torch.equal(placed[2], sources[2])


def test_chunks_come_as_needed_and_start_on_a_huge_page() -> None:
    arena = HugePageArena(1 << 20)
    first = arena.place(torch.ones(200_000))  # 0.8 MB: in the first chunk (rounded up to 2 MiB)
    big = arena.place(torch.arange(1_500_000, dtype=torch.float32))  # 6 MB: past it, a chunk of its own
    assert arena.chunks == 2 and arena.placed_bytes == 800_000 + 6_000_000
    assert first.data_ptr() % HUGE_PAGE_BYTES == 0 and big.data_ptr() % HUGE_PAGE_BYTES == 0
    assert float(big[-1]) == 1_499_999 and float(first.sum()) == 200_000
    with pytest.raises(ValueError, match="expected_bytes"):
        HugePageArena(-1)
    with pytest.raises(ValueError, match="CPU tensors"):
        arena.place(torch.empty(3, device="meta"))


def test_the_hint_never_raises_and_skips_what_holds_no_whole_huge_page() -> None:
    assert not huge_pages(torch.empty(16))
    assert not huge_pages(torch.empty((2, 1 << 20), dtype=torch.float64)[:, :1])  # a view's 16 bytes
    buf, hinted = aligned_huge(3 * HUGE_PAGE_BYTES)
    assert buf.data_ptr() % HUGE_PAGE_BYTES == 0 and buf.numel() == 3 * HUGE_PAGE_BYTES
    assert hinted == (sys.platform.startswith("linux") and _thp_allowed())
    buf.fill_(7)
    assert int(buf.sum()) == 7 * buf.numel()


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _thp_allowed(), reason="no transparent huge pages")
def test_placed_bytes_are_huge_pages_where_linux_gives_them() -> None:
    fallbacks = _vmstat("thp_fault_fallback")
    arena = HugePageArena(8 * HUGE_PAGE_BYTES)
    out = arena.place(torch.ones(8 * HUGE_PAGE_BYTES // 4))
    assert arena.huge_chunks == 1
    if _huge_kb_at(out.data_ptr()) == 0 and _vmstat("thp_fault_fallback") > fallbacks:
        pytest.skip("Linux found no free 2 MiB pages just now and fell back to small ones (thp_fault_fallback)")
    assert _huge_kb_at(out.data_ptr()) >= 2048
    plain = torch.ones(8 * HUGE_PAGE_BYTES // 4)  # the same size from the allocator: no hint asked
    assert _huge_kb_at(plain.data_ptr()) <= _huge_kb_at(out.data_ptr())


@pytest.mark.parametrize("tied", [False, True])
def test_a_model_with_huge_weights_gives_the_same_logits(tied: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from radixcache.runtime import Engine

    cfg = tiny_config(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)
    cfg = dataclasses.replace(cfg, tie_embeddings=tied)
    weights = random_weights(cfg, 11)
    if tied:
        weights.pop("lm_head.weight", None)
    monkeypatch.setattr(llama_weights, "MIN_HUGE_WEIGHTS", 0)  # so that a small model gets them
    huge = LlamaModel(cfg, weights)
    plain = LlamaModel(cfg, weights, huge_weights=False)
    for layer_huge, layer_plain in zip(huge.layers, plain.layers, strict=True):
        for name in ("qkv", "o", "gate_up", "down"):
            a, b = getattr(layer_huge, name), getattr(layer_plain, name)
            assert isinstance(a, DenseLinear) and torch.equal(a.weight, b.weight)
            assert a.weight.data_ptr() != b.weight.data_ptr()
    assert torch.equal(huge.embed, plain.embed) and torch.equal(huge.lm_head.weight, plain.lm_head.weight)
    assert huge.lm_head.weight.data_ptr() != plain.lm_head.weight.data_ptr()
    if tied:  # the head is the embedding, in huge pages once
        assert huge.lm_head.weight.data_ptr() == huge.embed.data_ptr()
    o_name = "model.layers.0.self_attn.o_proj.weight"  # an unfused matrix: apart from the caller's, or shared
    assert huge.layers[0].o.weight.data_ptr() != weights[o_name].data_ptr()
    assert plain.layers[0].o.weight.data_ptr() == weights[o_name].data_ptr()
    prompt = torch.randint(1, 97, (23,), generator=torch.Generator().manual_seed(2)).tolist()
    outs = []
    for model in (huge, plain):
        with Engine(model, capacity_blocks=32, page_size=8, threads=1, thread_policy="fixed") as engine:
            outs.append(engine.generate(prompt, 8, ignore_eos=True, temperature=0.0, return_logits=True))
    assert outs[0].token_ids == outs[1].token_ids
    assert outs[0].logits is not None and outs[1].logits is not None
    assert torch.equal(outs[0].logits, outs[1].logits)


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="the native kernels need a C compiler")
def test_gguf_blocks_stay_where_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tiny_config(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)
    weights = random_weights(cfg, 11)
    name = "model.layers.0.mlp.down_proj.weight"
    blocks = {name: random_block_weight("Q4_1", *weights[name].shape, seed=1)}
    weights[name] = blocks[name].dequantize()
    monkeypatch.setattr(llama_weights, "MIN_HUGE_WEIGHTS", 0)
    model = LlamaModel(cfg, weights, quant="gguf", blocks=blocks)
    down = model.layers[0].down
    assert isinstance(down, BlockLinear) and down.parts[0].data.data_ptr() == blocks[name].data.data_ptr()


def test_small_models_keep_their_weights_where_they_are() -> None:
    cfg = tiny_config()
    weights = random_weights(cfg, 1)
    model = LlamaModel(cfg, weights)  # far under MIN_HUGE_WEIGHTS: no arena, the unfused weights shared
    assert model.layers[0].o.weight.data_ptr() == weights["model.layers.0.self_attn.o_proj.weight"].data_ptr()
