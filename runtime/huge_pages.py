"""Host memory backed by transparent huge pages: the float32 weights a CPU decode streams every token, and any other
large buffer that is read end to end (the bandwidth reading that bounds the decode, kv.tier.staging's buffers).

Why: batch-1 decode reads every weight once per token. From ordinary 4 KiB pages each 4 KiB costs a TLB entry, and
on the project's 2-core Zen 4 VM the page walks, not the kernels, held the float32 decode back: SmolLM2 with its
weights in huge-page memory decoded at 70.9 tok/s against 57.6 from where the loader left them (medians of six
alternating rounds in one process, same kernels), and a 512 MB sum read up to a fifth more (docs/benchmarks.md).

`huge_pages(buf)` asks Linux (madvise MADV_HUGEPAGE) to back a fresh tensor's whole 2 MiB extents with huge pages;
it is a hint: under `transparent_hugepage=never`, or off Linux, nothing changes. `HugePageArena` lays tensors out
in 2 MiB-aligned chunks that got that hint before anything was written, so every extent of them can be a huge page.
Nothing here changes a byte: a placed tensor equals its source.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import torch

HUGE_PAGE_BYTES = 2 << 20  # x86-64's and arm64's transparent huge page
_ALIGN = 4096  # each tensor's start in a chunk (the native kernels want 64; a page keeps views apart)
_MADV_HUGEPAGE = 14  # Linux


def huge_pages(buf: torch.Tensor) -> bool:
    """Ask Linux to back a fresh CPU tensor's memory with transparent huge pages (a hint: where the kernel's setting
    allows, one fault and one TLB entry per 2 MiB instead of per 4 KiB). Only the whole 2 MiB extents inside the
    tensor are asked for (none in one under 2 MiB, or under 4 MiB that starts off a boundary). Whether the hint
    was taken; never raises."""
    size = buf.numel() * buf.element_size()
    if not sys.platform.startswith("linux") or buf.device.type != "cpu":
        return False
    start = -(-buf.data_ptr() // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    end = (buf.data_ptr() + size) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return end > start and libc.madvise(start, end - start, _MADV_HUGEPAGE) == 0
    except (OSError, AttributeError):
        return False


def aligned_huge(nbytes: int) -> tuple[torch.Tensor, bool]:
    """(`nbytes` of fresh uint8 CPU memory starting on a 2 MiB boundary, whether huge pages were granted for it). On
    Linux the memory is a private anonymous map of its own, never written before, so the hint applies from its first
    write (the allocator may hand out heap memory already faulted in with small pages, which a hint no longer
    changes). The view keeps its over-allocated base, and the map, alive."""
    if sys.platform.startswith("linux"):
        mapped = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        base = torch.frombuffer(mapped, dtype=torch.uint8)  # shares the map's memory and holds the map
    else:
        base = torch.empty(nbytes + HUGE_PAGE_BYTES, dtype=torch.uint8)
    skip = -base.data_ptr() % HUGE_PAGE_BYTES
    buf = base[skip : skip + nbytes]
    return buf, huge_pages(buf)


class HugePageArena:
    """Tensors copied into huge-page memory (`place`), packed one after another (each start 4 KiB-aligned) so that
    nearly all of their bytes lie in whole 2 MiB extents. Memory comes in chunks: the first of `expected_bytes`
    (what the caller expects to place; its end rounded up to 2 MiB), then more as needed. A chunk lives while any
    tensor placed in it does (each is a view that keeps its chunk). Not thread-safe: a model's constructor uses
    one, then drops it."""

    def __init__(self, expected_bytes: int) -> None:
        if expected_bytes < 0:
            raise ValueError(f"expected_bytes must be >= 0, got {expected_bytes}")
        self.expected_bytes = expected_bytes
        self._chunk: torch.Tensor | None = None
        self._used = 0
        self.chunks = 0  # chunks made
        self.huge_chunks = 0  # of them, the ones Linux took the hint for
        self.placed_bytes = 0

    @staticmethod
    def room(tensors_bytes: list[int]) -> int:
        """The bytes `place` needs for tensors of these sizes, in one chunk (with each start's alignment)."""
        return sum(-(-n // _ALIGN) * _ALIGN for n in tensors_bytes)

    def place(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of `tensor` (a CPU tensor) in the arena: same dtype, shape and values."""
        if tensor.device.type != "cpu":
            raise ValueError(f"only CPU tensors go to host huge pages, got one on {tensor.device}")
        nbytes = tensor.numel() * tensor.element_size()
        if self._chunk is None or self._used + nbytes > self._chunk.numel():
            want = self.expected_bytes - self.placed_bytes if self._chunk is None else 0
            size = -(-max(want, nbytes, 1) // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
            self._chunk, huge = aligned_huge(size)
            self._used = 0
            self.chunks += 1
            self.huge_chunks += huge
        out = self._chunk[self._used : self._used + nbytes].view(tensor.dtype).view(tensor.shape)
        out.copy_(tensor)
        self._used = -(-(self._used + nbytes) // _ALIGN) * _ALIGN
        self.placed_bytes += nbytes
        return out
