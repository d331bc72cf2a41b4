"""Staging memory for disk pages read ahead (kv.tier.prefetch), kept for the next prefetch instead of freed.

A prefetch stages its pages in host memory (`[layers, 2, pages, page_size, kv_heads, head_dim]`) before they are
copied into the pool. Fresh memory costs a page fault and a zeroed 4 KiB page on its first write: measured on this
2-core CPU, 64 SmolLM2 pages (47 MB) written into fresh memory took 48 to 58 ms, into memory written before 4 to
8 ms; the faults were most of a disk read's CPU time, and they ran beside the decodes (pinned memory on CUDA costs
more again). So a job's staging is a view of a kept buffer with room for it, and goes back when the job is done;
a new buffer (a process's first prefetch: after a restart) asks for transparent huge pages, where Linux allows.
And an engine with a disk tier writes one buffer once as it starts (`prewarm`, by default room for 128 pages within
the bound; kv.tier.prefetch's reader does it in its constructor), so that its first prefetch does not fault in new
memory beside the decodes either: in the prefetch benchmark the step a 2,000-token prefix's first pages were read
in took 104 to 224 ms against a 21 ms decode step, and 33 to 97 ms with the buffer written before.

A page's rows in a buffer (`PageRows`) are the byte ranges its file's payload is read into.

Bounded in bytes (`max_bytes`: kv.tier.coordinator's `staging_bound`, the pool's size up to `DEFAULT_MAX_BYTES`): the
buffers handed out and those kept together never exceed it (`held_bytes`; `peak_bytes` its high-water mark). `get`
drops kept buffers to make room, and a caller asks `fits` first: past the bound a prefetch waits or is cut
(kv.tier.prefetch). A 4096-page bound was 3 GB of SmolLM2's pages; the host tier's size cut the loads of an engine
with a small one.

Invariants: a buffer is handed to one job at a time (between `get` and `put`); at most `keep_bytes` of buffers are
kept while unused (past it the smallest go); a buffer larger than that is never kept; `held_bytes <= max_bytes`
whenever every `get` was asked `fits` first. Thread-safe: jobs are given
buffers on the engine loop and return them from whichever thread lets go of them last (a reader or the loop).
Imports torch; nothing of the KV manager.
"""

from __future__ import annotations

import ctypes
import math
import threading

import torch

from radixcache.runtime.huge_pages import huge_pages
from radixcache.runtime.kv.tier.native_reads import StridedRows

DEFAULT_KEEP_BYTES = 256 << 20
DEFAULT_MAX_BYTES = 512 << 20  # staging without a host tier: SmolLM2's 8,192-token context (512 pages) in one job


class StagingBuffers:
    """Kept staging buffers for pages of one shape (`page_shape`: layers, 2, page_size, kv_heads, head_dim)."""

    def __init__(
        self,
        page_shape: tuple[int, ...],
        dtype: torch.dtype,
        *,
        pin: bool = False,
        keep_bytes: int = DEFAULT_KEEP_BYTES,
        max_bytes: int | None = None,
    ) -> None:
        self.page_shape = page_shape
        self.dtype = dtype
        self.pin = pin
        self.keep_bytes = keep_bytes
        self.page_bytes = math.prod(page_shape) * torch.empty((), dtype=dtype).element_size()
        self.max_bytes = max_bytes  # None: no bound
        self._free: list[torch.Tensor] = []  # unused, smallest first
        self._lock = threading.Lock()
        self._in_use = 0  # bytes of the buffers handed out and not yet put back
        self.allocated = 0  # buffers made (a test's and a benchmark's view of the reuse)
        self.peak_bytes = 0  # the most `held_bytes` ever were

    @property
    def max_pages(self) -> int | None:
        """The most pages one buffer may have under `max_bytes` (None: no bound)."""
        return None if self.max_bytes is None else self.max_bytes // self.page_bytes

    def fits(self, pages: int) -> bool:
        """Whether `get(pages)` stays within `max_bytes` now (a kept buffer with room, or new memory)."""
        with self._lock:
            return self._kept_for(pages) is not None or self._new_fits(pages)

    def _kept_for(self, pages: int) -> int | None:
        """The smallest kept buffer with room for `pages` (handing it out holds no more memory). Under the lock."""
        return next((i for i, buf in enumerate(self._free) if buf.shape[2] >= pages), None)

    def _new_fits(self, pages: int) -> bool:
        return self.max_bytes is None or self._in_use + pages * self.page_bytes <= self.max_bytes

    def _bytes(self, buf: torch.Tensor) -> int:
        return buf.shape[2] * self.page_bytes

    def get(self, pages: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(a buffer, its view of `pages` pages): the smallest kept buffer with room, else a new one, for which kept
        buffers are dropped (smallest first) as far as `max_bytes` needs."""
        with self._lock:
            i = self._kept_for(pages)
            if i is not None:
                buf = self._free.pop(i)
                self._in_use += self._bytes(buf)
                return buf, buf[:, :, :pages]
            need = pages * self.page_bytes
            while self._free and self.max_bytes is not None and self.held_bytes + need > self.max_bytes:
                self._free.pop(0)
            self.allocated += 1
            self._in_use += need
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
        layers, two, p, heads, dim = self.page_shape
        try:
            buf = torch.empty((layers, two, pages, p, heads, dim), dtype=self.dtype, pin_memory=self.pin)
        except BaseException:
            with self._lock:
                self._in_use -= need
            raise
        if not self.pin:
            huge_pages(buf)
        return buf, buf

    def put(self, buf: torch.Tensor) -> None:
        """A job is done with `buf` (nothing reads or writes it any more): keep it, within `keep_bytes`."""
        size = self._bytes(buf)
        with self._lock:
            self._in_use -= size
            if size > self.keep_bytes:
                return
            self._free.append(buf)
            self._free.sort(key=lambda b: b.shape[2])
            while self.kept_bytes > self.keep_bytes:
                self._free.pop(0)

    def prewarm(self, pages: int) -> None:
        """Make a buffer of `pages` pages (at most what `keep_bytes` keeps), write every byte of it once, and keep
        it: its page faults are taken now, on the calling thread, and not by a later prefetch. The bytes are
        written by memset on this thread alone (no OpenMP team: runtime.kv.tier.prefetch) and without the GIL."""
        pages = min(pages, self.keep_bytes // self.page_bytes, pages if self.max_pages is None else self.max_pages)
        if pages < 1 or not self.fits(pages):
            return
        buf, _ = self.get(pages)
        ctypes.memset(buf.data_ptr(), 0, buf.numel() * buf.element_size())
        self.put(buf)

    @property
    def kept_bytes(self) -> int:
        return sum(b.shape[2] for b in self._free) * self.page_bytes

    @property
    def held_bytes(self) -> int:
        """Staging memory now: the buffers handed out and those kept."""
        return self._in_use + self.kept_bytes


class PageRows:
    """The byte rows of each page of one staging buffer (contiguous, `[layers, 2, pages, ...]`): `rows(page)` is a
    writable view per layer and K/V, in the order of a page file's payload (the page's `[layers, 2, page_size,
    kv_heads, head_dim]`, row-major), which a reader fills from the file directly (DiskStore.read_into); one stride
    apart, so that the native read fills them in one call (kv.tier.native_reads)."""

    def __init__(self, buffer: torch.Tensor) -> None:
        if not buffer.is_contiguous() or buffer.dim() < 3:
            raise ValueError(f"a staging buffer is contiguous, [layers, 2, pages, ...]: got {tuple(buffer.shape)}")
        self._flat = memoryview(buffer.view(torch.uint8).numpy().reshape(-1))
        self._address = buffer.data_ptr()
        self._count, self.pages = buffer.shape[0] * buffer.shape[1], buffer.shape[2]
        self._row = self._flat.nbytes // (self._count * self.pages)

    def __call__(self, page: int) -> StridedRows:
        if not 0 <= page < self.pages:
            raise ValueError(f"page {page} of a staging buffer of {self.pages}")
        row, stride, first = self._row, self._row * self.pages, self._row * page
        views = [self._flat[first + j * stride :][:row] for j in range(self._count)]
        return StridedRows(views, self._address + first, row, stride)
