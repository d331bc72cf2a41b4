"""Pages written to a real disk store, and a stand-in for the pool a PrefetchReader reads its shape from: what the
prefetch reader's own tests read, without an engine."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.prefetch_job import PrefetchJob


def stored_pages(directory: Path, pages: list[torch.Tensor]) -> tuple[DiskStore, PrefetchJob, SimpleNamespace]:
    """A disk store in `directory` holding `pages` (each `[layers, 2, page_size, kv_heads, head_dim]`, one dtype),
    written and flushed; a job that reads all of them in order; a pool-like object of their shape on the CPU."""
    layers, _, page_size, kv_heads, head_dim = pages[0].shape
    dtype = pages[0].dtype
    disk = DiskStore(directory, max_bytes=1 << 30)
    hashes = [bytes([i + 1]) * 16 for i in range(len(pages))]
    tokens = [list(range(i * page_size, (i + 1) * page_size)) for i in range(len(pages))]
    meta = {"dtype": str(dtype), "shape": list(pages[0].shape)}
    for h, t, page in zip(hashes, tokens, pages, strict=True):
        assert disk.put(h, t, page.view(torch.uint8).numpy().tobytes(), meta)
    assert disk.flush(30)
    pool = SimpleNamespace(
        num_layers=layers,
        page_size=page_size,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        device=torch.device("cpu"),
    )
    return disk, PrefetchJob(0, hashes, tokens, []), pool
