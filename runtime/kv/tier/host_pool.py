"""The host tier's memory: KV pages in host RAM, in the device pool's layout, indexed by host slot.

Layout `[layers, 2, num_slots, page_size, kv_heads, head_dim]`, the device pool's with slots for blocks, so pages
move to the host as one `index_select` and one `index_copy_`, and back in runs of slice copies (kv.tier.page_copy).
On CUDA the memory is pinned and loads run on a side stream (`load` returns an event to wait on before the pages
are read, or None when done); what is pinned and how the streams are ordered are decided by
radixcache.runtime.kv.tier.copy_sync, tested on the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.kv.tier.copy_sync import pins_host_memory, side_stream_copy
from radixcache.runtime.kv.tier.page_copy import copy_pages


class HostKVPool:
    """`num_slots` pages of KV in host memory, for the pages of `pool`'s model, dtype and page size."""

    def __init__(self, pool: KVPool, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"the host tier needs at least one page, got {num_slots}")
        self.num_slots = num_slots
        self.device = pool.device
        shape = (pool.num_layers, 2, num_slots, pool.page_size, pool.kv_heads, pool.head_dim)
        pin = pins_host_memory(pool.device.type)
        self.kv = torch.zeros(shape, dtype=pool.dtype, pin_memory=pin)
        self._stream = torch.cuda.Stream(device=pool.device) if pin else None
        self.save_seconds = 0.0  # wall time spent copying device -> host (the loop thread's cost)
        self.saved_pages = 0

    @staticmethod
    def page_bytes(pool: KVPool) -> int:
        return pool.num_layers * 2 * pool.page_size * pool.kv_heads * pool.head_dim * pool.kv.element_size()

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def save(self, pool: KVPool, blocks: Sequence[int], slots: list[int]) -> None:
        """Copy device `blocks` into host `slots` now: the blocks may be reused as soon as this returns."""
        t0 = time.perf_counter()
        src = pool.kv.index_select(2, torch.tensor(blocks, device=pool.device))
        self.kv.index_copy_(2, torch.tensor(slots), src.to("cpu"))
        self.save_seconds += time.perf_counter() - t0
        self.saved_pages += len(blocks)

    def load(self, pool: KVPool, slots: list[int], blocks: Sequence[int]) -> torch.cuda.Event | None:
        """Copy host `slots` into device `blocks`, in runs of consecutive pages (kv.tier.page_copy: one slice copy
        per run, no gathered temporary). On the CPU the copy is done on return (None). On CUDA it runs on a side
        stream from the pinned pages, the compute stream is made to wait for it, and the returned event marks when
        the host slots may be overwritten; a load that raises has waited for the copies it had queued."""
        if self._stream is None:
            copy_pages(pool.kv, blocks, self.kv, slots)
            return None

        def copy() -> None:
            copy_pages(pool.kv, blocks, self.kv, slots, non_blocking=True)

        main = torch.cuda.current_stream(pool.device)
        return side_stream_copy(main, self._stream, copy, on_stream=torch.cuda.stream, new_event=torch.cuda.Event)

    def page(self, slot: int) -> torch.Tensor:
        """One page, `[layers, 2, page_size, kv_heads, head_dim]` (a view)."""
        return self.kv[:, :, slot]
