"""The prefetch readers read a page's payload straight into its rows of staging memory (runtime.kv.tier.staging
`PageRows`, DiskStore.read_into) on their own thread alone: byte for byte what the file holds, for every KV dtype,
the neighbouring pages untouched, and without an OpenMP team of their own.

Why the last point matters: a torch copy of a page's size runs on an OpenMP team of the calling thread, and a
reader thread keeps its team for the engine's life. Once a process manages more OpenMP threads than it has CPUs,
libgomp shortens every team's spin-wait, so the engine loop's team sleeps and wakes at every parallel kernel (a
2-core machine's float32 SmolLM2 decode step went from 25 to 38-46 ms after an engine's first disk read). The
check: after the readers have read pages twice the size at which torch splits a copy over threads, with torch set to
2 threads, the process has no thread that is neither one it had before nor a Python thread (a reader); with the
readers' old `Tensor.copy_` of each page it had one OpenMP worker per reader."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch

from radixcache.runtime.kv.tier.prefetch import PrefetchReader
from radixcache.runtime.kv.tier.staging import PageRows
from tests.runtime.tiers.stored_pages import stored_pages

SHAPE = (4, 2, 16, 8, 64)  # layers, K/V, page_size, kv_heads, head_dim: 65,536 values, twice torch's copy grain
PAGES = 6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_a_page_is_read_into_its_rows_of_a_staging_buffer(tmp_path: Path, dtype: torch.dtype) -> None:
    page = torch.randn(SHAPE).to(dtype)
    disk, job, _ = stored_pages(tmp_path, [torch.zeros(SHAPE, dtype=dtype), page])
    try:
        staging = torch.zeros((SHAPE[0], 2, 3, *SHAPE[2:]), dtype=dtype)
        meta = disk.read_into(job.hashes[1], job.tokens[1], PageRows(staging)(1), bytearray())
        assert meta is not None and meta["dtype"] == str(dtype)
        assert torch.equal(staging[:, :, 1].view(torch.uint8), page.view(torch.uint8))
        assert not staging[:, :, 0].any() and not staging[:, :, 2].any()  # the neighbours are untouched
    finally:
        disk.close(10)


def test_page_rows_refuses_a_page_past_the_buffer_or_a_strided_buffer() -> None:
    staging = torch.zeros((SHAPE[0], 2, 3, *SHAPE[2:]))
    rows = PageRows(staging)
    assert len(rows(2)) == 2 * SHAPE[0] and sum(len(r) for r in rows(2)) == staging[:, :, 2].numel() * 4
    for page in (3, -1):
        with pytest.raises(ValueError, match=f"page {page}"):
            rows(page)
    with pytest.raises(ValueError, match="contiguous"):
        PageRows(staging[:, :, :2])


def _tids() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


@pytest.fixture
def two_torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # where torch would split a page's copy over a team of threads
    yield
    torch.set_num_threads(before)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc to list threads")
def test_readers_read_pages_without_an_openmp_team_of_their_own(tmp_path: Path, two_torch_threads: None) -> None:
    pages = [torch.randn(SHAPE, generator=torch.Generator().manual_seed(i)) for i in range(PAGES)]
    disk, job, pool = stored_pages(tmp_path, pages)
    reader = PrefetchReader(disk, pool, policy="wait_complete", workers=2)  # type: ignore[arg-type]
    before = _tids()
    try:
        with torch.inference_mode():  # as on the engine loop, which makes the staging tensor
            reader.submit(job)
            deadline = time.monotonic() + 30
            while not reader.ready(job):
                assert time.monotonic() < deadline, "the readers never finished"
                reader.wait(0.05)
            arrived, staging = reader.take(job)
        # before this thread runs a torch kernel of its own (which may start its own team again)
        strangers = _tids() - before - {t.native_id for t in threading.enumerate()}
        assert not strangers, f"threads the readers started beside themselves (OpenMP workers): {sorted(strangers)}"
        assert arrived == PAGES and staging is not None
        for i, page in enumerate(pages):
            assert torch.equal(staging[:, :, i], page)
    finally:
        reader.release(job)
        reader.close()
        disk.close(10)
