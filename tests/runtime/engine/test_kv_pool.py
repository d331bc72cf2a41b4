"""The paged KV pool: sizing from a memory budget, layout, and slot addressing through a block table."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

import pytest
import torch

from radixcache.runtime.kv.pool import KVPool, blocks_for_budget, parse_memory, populate
from radixcache.runtime.testing import tiny_config


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2GiB", 2 * 1024**3), ("512MiB", 512 * 1024**2), ("1.5GB", 1_500_000_000), ("4096", 4096), (123, 123)],
)
def test_parse_memory_understands_binary_and_decimal_units(text: str | int, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["", "two GiB", "5XB", "0MiB", -1, 0, "9" * 400, "9" * 300 + "GiB"])
def test_parse_memory_rejects_nonsense(bad: str | int) -> None:
    with pytest.raises(ValueError):
        parse_memory(bad)


def test_budget_gives_the_number_of_whole_pages_that_fit() -> None:
    cfg = tiny_config()  # 2 layers * 2 (K,V) * 2 heads * 8 dims * 4 bytes = 256 bytes per token
    assert cfg.kv_bytes_per_token(4) == 256
    assert blocks_for_budget(cfg, "1MiB", 16, torch.float32) == 1024**2 // (256 * 16)
    assert blocks_for_budget(cfg, "1MiB", 16, torch.bfloat16) == 1024**2 // (128 * 16)
    with pytest.raises(ValueError):
        blocks_for_budget(cfg, 100, 16, torch.float32)


def test_pool_layout_is_layers_kv_blocks_page_heads_dim() -> None:
    cfg = tiny_config()
    pool = KVPool.from_budget(cfg, "64KiB", 4)
    assert pool.kv.shape == (2, 2, pool.num_blocks, 4, 2, 8)
    assert pool.nbytes <= 64 * 1024
    assert pool.capacity_tokens == pool.num_blocks * 4
    assert torch.count_nonzero(pool.kv) == 0  # zeroed: padded decode reads finite values


def test_writes_land_in_the_pages_of_the_block_table() -> None:
    cfg = tiny_config()
    pool = KVPool(cfg, num_blocks=6, page_size=4)
    table = torch.tensor([5, 2, 0])  # positions 0-3 -> block 5, 4-7 -> block 2, 8-11 -> block 0
    positions = torch.arange(3, 10)
    slots = pool.slots(table, positions)
    assert slots.tolist() == [23, 8, 9, 10, 11, 0, 1]
    k = torch.randn(7, 2, 8)
    v = torch.randn(7, 2, 8)
    pool.write(1, slots, k, v)
    k_pages, v_pages = pool.layer(1)
    assert torch.equal(k_pages[5, 3], k[0])
    assert torch.equal(v_pages[2, 0], v[1])
    assert torch.equal(k_pages[0, 1], k[6])
    assert torch.count_nonzero(pool.kv[0]) == 0  # other layers untouched


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096  # resident pages (Linux reports them in 4 KiB units here)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux's /proc")
def test_a_cpu_pool_takes_memory_only_for_the_pages_written() -> None:
    cfg = tiny_config()
    blocks = blocks_for_budget(cfg, "256MiB", 16, torch.float32)
    before = _resident_bytes()
    pool = KVPool(cfg, num_blocks=blocks, page_size=16)
    assert pool.nbytes >= 250 * 2**20
    assert _resident_bytes() - before < 32 * 2**20  # the kernel's zero pages, faulted in as they are written
    assert pool.kv.is_contiguous() and pool.kv.data_ptr() % 4096 == 0
    slots = pool.slots(torch.tensor([blocks - 1]), torch.arange(0, 16))
    k, v = torch.randn(16, cfg.num_kv_heads, cfg.head_dim), torch.randn(16, cfg.num_kv_heads, cfg.head_dim)
    pool.write(cfg.num_layers - 1, slots, k, v)
    k_pages, v_pages = pool.layer(cfg.num_layers - 1)
    assert torch.equal(k_pages[blocks - 1], k) and torch.equal(v_pages[blocks - 1], v)
    assert torch.count_nonzero(pool.kv[: cfg.num_layers - 1]) == 0  # every other byte reads as zero


def resident_pages(t: torch.Tensor) -> int:
    """Pages of `t`'s (page-aligned) memory that are resident, by mincore(2)."""
    page = mmap.PAGESIZE
    n = -(-t.numel() * t.element_size() // page)
    vec = (ctypes.c_ubyte * n)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(t.data_ptr(), n * page, vec) == 0
    return sum(b & 1 for b in vec)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE and mincore are Linux's")
def test_populate_faults_a_pool_in_and_changes_no_byte() -> None:
    pool = KVPool(tiny_config(), num_blocks=4096, page_size=16)  # 16 MiB, never written
    kv = pool.kv
    kv[1, 0, 7].fill_(3.0)  # one page written before: its bytes must stay
    pages = -(-kv.numel() * kv.element_size() // mmap.PAGESIZE)
    assert resident_pages(kv) < pages // 8
    assert not populate(kv, stop=lambda: True), "a stop before the first step populates nothing"
    assert resident_pages(kv) < pages // 8
    if not populate(kv, step=1 << 20):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
    assert resident_pages(kv) == pages
    assert torch.equal(kv[1, 0, 7], torch.full_like(kv[1, 0, 7], 3.0))
    assert torch.count_nonzero(kv) == kv[1, 0, 7].numel()


def _mem_total() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        line = next(x for x in f if x.startswith("MemTotal:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="needs Linux's /proc")
@pytest.mark.parametrize("option", ["kv_memory", "capacity_blocks", "host_kv_memory"])
def test_a_pool_larger_than_the_machine_is_refused_by_name_before_it_is_built(tiny, option: str) -> None:
    """A KV budget past the machine's memory (a typo, a GPU's figure on a laptop) was built as a lazily mapped pool
    that could never fill, or failed on a bare OSError, or spent minutes listing 2e10 free pages: now a ValueError
    naming the option. A budget that fits still builds."""
    from radixcache.runtime import Engine

    too_much = _mem_total() + 2**30
    page = tiny.config.kv_bytes_per_token(4) * 16
    value = {"capacity_blocks": too_much // page + 1}.get(option, too_much)
    with pytest.raises(ValueError, match=f"{option}=.* more than this machine's"):
        Engine(tiny, **{option: value})
    engine = Engine(tiny, **{option: 4 * page} if option != "capacity_blocks" else {option: 4})
    assert engine.generate([1, 2, 3], 2, ignore_eos=True).token_ids
    engine.close()


def test_a_disk_tier_smaller_than_one_page_is_refused_by_name(tiny, tmp_path) -> None:
    """A cache_dir_size under one page file's bytes made a disk tier that refused every write, silently. One page's
    KV alone is still too small (a page file has a header); a little more holds it."""
    from radixcache.runtime import Engine

    page = tiny.config.kv_bytes_per_token(4) * 16
    for size in (page - 1, page):
        with pytest.raises(ValueError, match=f"cache_dir_size {size} is smaller than one page's file"):
            Engine(tiny, cache_dir=str(tmp_path / "c"), cache_dir_size=size)
    # a pool of 64 pages, not 512 MiB's worth: the disk tier's page is the same
    with Engine(tiny, cache_dir=str(tmp_path / "d"), cache_dir_size=page + 4096, capacity_blocks=64) as engine:
        assert engine.generate(list(range(1, 40)), 2, ignore_eos=True).token_ids
        assert engine.flush(30)
    pages = [p for p in (tmp_path / "d" / "pages").rglob("*") if p.is_file() and p.name != "fingerprint.json"]
    assert len(pages) == 1, pages  # it holds one page, and writes it
