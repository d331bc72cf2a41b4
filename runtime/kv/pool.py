"""The paged KV pool: one tensor of K and V pages for every layer, indexed by the radix tree's block ids.

Layout `[layers, 2, num_blocks, page_size, kv_heads, head_dim]`: block `b` holds the K (index 0) and V (index 1)
of `page_size` consecutive token positions of one sequence, in every layer. The tree hands out block ids; this
module only turns them into memory. A token at position `pos` of a sequence whose block table is `table` lives
in slot `table[pos // page_size] * page_size + pos % page_size` of the flattened `[num_blocks * page_size]` axis.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import re
import sys
from collections.abc import Callable

import torch

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.machine import device_memory

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def parse_memory(size: str | int) -> int:
    """Bytes in a memory budget: an int, or a string such as "2GiB", "512MiB", "1.5GB", "4096"."""
    if isinstance(size, int) and not isinstance(size, bool):
        if size <= 0:
            raise ValueError(f"memory budget must be positive, got {size}")
        return size
    if not isinstance(size, str):
        raise TypeError(f"memory budget must be a str or int, got {type(size).__name__}")
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", size)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot parse memory budget {size!r}; use e.g. '2GiB', '512MiB' or a byte count")
    number = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(number):  # hundreds of digits: int() would raise OverflowError
        raise ValueError(f"memory budget {size!r} is too large")
    value = int(number)
    if value <= 0:
        raise ValueError(f"memory budget must be positive, got {size!r}")
    return value


def page_bytes(config: ModelConfig, page_size: int, dtype: torch.dtype) -> int:
    """Bytes of one page of `page_size` tokens' K and V in every layer, for this model and dtype."""
    return config.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size()) * page_size


def blocks_for_budget(config: ModelConfig, budget: str | int, page_size: int, dtype: torch.dtype) -> int:
    """How many pages of `page_size` tokens fit in `budget` bytes of KV for this model and dtype."""
    per_block = page_bytes(config, page_size, dtype)
    n = parse_memory(budget) // per_block
    if n < 1:
        raise ValueError(f"KV budget {budget!r} is smaller than one page ({per_block} bytes)")
    return n


def check_fits(nbytes: int, device: torch.device, option: str) -> None:
    """ValueError naming `option` when `nbytes` is more than `device` has in all. Such a pool could never be filled,
    and its bookkeeping alone may not fit (a list of free page ids, a word a page: 1e15 bytes of SmolLM2's KV are
    2e10 pages), so it is refused before anything is allocated, rather than failing on a bare OSError or not at all."""
    total = device_memory(device)
    if total is not None and nbytes > total:
        where = "this machine's" if device.type == "cpu" else f"the {device.type} device's"
        raise ValueError(f"{option} asks for {nbytes / 2**30:,.1f} GiB, more than {where} {total / 2**30:,.1f} GiB")


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed tensor. On the CPU its memory is an anonymous map: the kernel's zero pages, each faulted in when first
    written, so a pool of 512 MiB costs nothing until it holds pages (torch.zeros writes every byte at once: 0.2 s and
    131k page faults for the tiny test model's default pool, most of it system time). Page-aligned; the tensor keeps
    the map alive."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8).view(dtype).view(shape)


_MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault pages in writable without writing them (their bytes stay)


def populate(t: torch.Tensor, stop: Callable[[], bool] = lambda: False, step: int = 16 << 20) -> bool:
    """Fault in the memory of CPU tensor `t` (a `zeroed` one: committed as first written) without changing a byte,
    `step` bytes at a time until `stop()` says so: a later first write there (a disk load's copy into new blocks)
    then takes no page faults. Safe while other threads read and write `t`. Whether all of it was populated
    (False off Linux, on a kernel without MADV_POPULATE_WRITE, off the CPU, or when stopped)."""
    if not sys.platform.startswith("linux") or t.device.type != "cpu":
        return False
    page = mmap.PAGESIZE
    start = t.data_ptr() // page * page
    end = t.data_ptr() + t.numel() * t.element_size()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        for at in range(start, end, step):
            if stop() or libc.madvise(at, min(step, end - at), _MADV_POPULATE_WRITE) != 0:
                return False
    except (OSError, AttributeError):
        return False
    return True


def gather_pages(pages: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` positions of one sequence, `[length, kv_heads, head_dim]`, copying only its pages."""
    page_size = pages.shape[1]
    nb = -(-length // page_size)
    seq = pages.index_select(0, block_table[:nb])
    return seq.reshape(nb * page_size, *pages.shape[2:])[:length]


class KVPool:
    """K and V pages for all layers. Allocation is the radix cache's job; this class only stores and reads.

    The pool starts zeroed: slots past a sequence's length that a padded decode batch reads are then finite
    (zero, or stale finite values), so masked attention never multiplies a zero weight by NaN.
    """

    def __init__(
        self,
        config: ModelConfig,
        num_blocks: int,
        page_size: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        if num_blocks < 1 or page_size < 1:
            raise ValueError(f"num_blocks and page_size must be >= 1, got {num_blocks}, {page_size}")
        self.num_layers = config.num_layers
        self.num_blocks = num_blocks
        self.page_size = page_size
        self.kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (config.num_layers, 2, num_blocks, page_size, config.num_kv_heads, config.head_dim)
        self.kv = zeroed(shape, dtype, self.device)

    @classmethod
    def from_budget(
        cls,
        config: ModelConfig,
        budget: str | int,
        page_size: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> KVPool:
        """A pool holding as many pages as fit in `budget` (e.g. "2GiB")."""
        return cls(config, blocks_for_budget(config, budget, page_size, dtype), page_size, dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.page_size

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views (no copy) of one layer's K and V pages, each `[num_blocks, page_size, kv_heads, head_dim]`."""
        return self.kv[layer, 0], self.kv[layer, 1]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store `k`, `v` (`[n, kv_heads, head_dim]`) at flat `slots` (`[n]`, int64) of one layer."""
        flat = self.kv[layer].view(2, self.num_blocks * self.page_size, self.kv_heads, self.head_dim)
        flat[0].index_copy_(0, slots, k if k.dtype == self.dtype else k.to(self.dtype))
        flat[1].index_copy_(0, slots, v if v.dtype == self.dtype else v.to(self.dtype))

    def copy_block(self, src: int, dst: int) -> None:
        """Copy block `src`'s K and V, every layer, into block `dst` (a cached page the request then writes into)."""
        self.kv[:, :, dst].copy_(self.kv[:, :, src])

    def slots(self, block_table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Flat slot of each position of one sequence: `block_table[pos // P] * P + pos % P`."""
        p = self.page_size
        return block_table[positions // p] * p + positions % p

    def __repr__(self) -> str:
        return (
            f"KVPool(layers={self.num_layers}, blocks={self.num_blocks}, page_size={self.page_size}, "
            f"kv_heads={self.kv_heads}, head_dim={self.head_dim}, dtype={self.dtype}, "
            f"{self.nbytes / 2**20:.1f} MiB, device={self.device})"
        )
