"""kill -9 at 50 random instants while a process writes pages through the real DiskStore, then a restart that reads
back every page on disk: each one equals, byte for byte, the payload and tokens derived from its hash (what was
written), nothing fails its checks, the directory is adopted again (even when the kill cut the first open, the
marker's write, short), and the dead writers' temporary files are gone. Then a few real-engine restarts after
kill -9 in the middle of serving (the tiny random model, float64): every output equals a no-cache engine's.

The writers are forked from a small fork server (tests/runtime/tier_faults/kill9_writer.py: no interpreter start
each time, and no copy of the pytest worker's page tables: 50 kills stay affordable); so are the engines, each a
process of its own, as a server would be (the server imports torch and the runtime once, not once per engine).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime.kv.tier.disk_store import MARKER_NAME, DiskStore
from tests.runtime.tier_faults.kill9_writer import FP, MAX_BYTES, META, payload, tokens

KILLS = 50
REPO = Path(__file__).resolve().parents[3]


class Writers:
    """The fork server of kill9_writer, a process of its own (see its docstring)."""

    def __init__(self) -> None:
        cmd = [sys.executable, "-m", "tests.runtime.tier_faults.kill9_writer"]
        self._proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def _ask(self, *request: object) -> Any:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        answer = self._proc.stdout.readline()
        assert answer, f"the fork server ended ({self._proc.poll()})"
        return json.loads(answer)

    def start(self, directory: Path, seed: int) -> int:
        """Fork a writer; its pid (it is writing, or about to, when this returns)."""
        return int(self._ask("start", str(directory), seed))

    def engine(self, directory: Path, seed: int) -> int:
        """Fork an engine serving with its disk tier in `directory` (kill9_writer.serve_forever); its pid."""
        return int(self._ask("engine", str(directory), seed))

    def killed(self, pid: int) -> bool:
        """Reap a writer or an engine: True if SIGKILL ended it."""
        return bool(self._ask("wait", pid))

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(30)


@pytest.fixture(scope="module")
def writers() -> Iterator[Writers]:
    server = Writers()
    yield server
    server.close()


def _check_restart(directory: Path) -> int:
    """Reopen and read back every page file on disk; return how many there are."""
    with DiskStore(directory, max_bytes=MAX_BYTES, fingerprint=FP) as store:
        assert store.enabled, f"restart after kill -9 did not adopt {directory}"
        files = store.layout.page_files()
        for _, hash_hex, path in files:
            h = bytes.fromhex(hash_hex)
            assert store.read(h, tokens(h)) == (payload(h), META), path
        assert store.stats().corrupt_pages == 0
        leftovers = [n for n in os.listdir(store.tmp_dir) if n.split("-", 1)[0] != str(os.getpid())]
        assert leftovers == [], "temporary files of killed writers were left"
        assert (directory / MARKER_NAME).is_file()
    return len(files)


@pytest.mark.slow  # 50 forked writers: about 3 s
def test_kill_9_at_50_random_points_never_leaves_a_wrong_page(tmp_path: Path, writers: Writers) -> None:
    rng = random.Random(31)
    directory = tmp_path / "kv"
    pages_seen = []
    for k in range(KILLS):
        if k % 10 == 0:  # a fresh directory, killed early: in the middle of adopting it (marker, folders)
            directory = tmp_path / f"kv{k}"
            delay = rng.uniform(0.0, 0.004)
        else:
            delay = rng.uniform(0.0, 0.06)
        pid = writers.start(directory, seed=k)
        if k % 10:  # mid-run: once pages are being written (on a loaded machine a writer may start late)
            deadline = time.monotonic() + 30  # a bound on waiting, not a timing assertion
            while time.monotonic() < deadline and not any(directory.rglob("*.kvpage")):
                time.sleep(0.001)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        assert writers.killed(pid), "the writer ended before the kill"
        pages = _check_restart(directory) if directory.exists() else 0
        if k % 10:
            pages_seen.append(pages)
    # The kills did land during writing: every directory holds pages from its second kill on. (A count of pages by
    # then, `> 20`, failed on a loaded machine, the writers being slower, not wrong.)
    assert len(pages_seen) == KILLS - KILLS // 10 and min(pages_seen) > 0


@pytest.mark.slow
def test_engine_restarts_after_kill_9_serve_outputs_equal_a_no_cache_engine(tmp_path: Path, writers: Writers) -> None:
    from radixcache.runtime import Engine
    from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

    m = tiny_model(seed=5)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    cache_dir = tmp_path / "kv"
    rng = random.Random(4)
    prompts = [[rng.randrange(m.config.vocab_size) for _ in range(48)] for _ in range(3)]
    opts = {"capacity_blocks": 120, "page_size": 4, "dtype": "float64"}
    with Engine(model, enable_cache=False, **opts) as plain:
        want = [plain.generate(p, max_new_tokens=4).token_ids for p in prompts]
    for round_ in range(3):
        pid = writers.engine(cache_dir, round_)
        try:
            deadline = time.monotonic() + 60  # a bound on waiting, not a timing assertion
            while len(list(cache_dir.rglob("*.kvpage"))) < 30 * (round_ + 1):
                assert time.monotonic() < deadline, "the engine wrote no pages"
                time.sleep(0.01)
            time.sleep(random.Random(round_).uniform(0.0, 0.05))
        finally:
            os.kill(pid, signal.SIGKILL)
            assert writers.killed(pid), "the engine ended before the kill"  # reaped: dead before the restart
        # the restarted engine serves the killed one's pages, and the prompts it writes now
        with Engine(model, cache_dir=cache_dir, load_back="always", **opts) as engine:
            assert [engine.generate(p, max_new_tokens=4).token_ids for p in prompts] == want
            assert [engine.generate(p, max_new_tokens=4).token_ids for p in prompts] == want
            assert engine.stats.tiers.disk_failed_reads == 0
            engine.check()
    with Engine(model, cache_dir=cache_dir, load_back="always", **opts) as engine:
        assert [engine.generate(p, max_new_tokens=4).token_ids for p in prompts] == want
        assert engine.stats.tiers.disk_hit_tokens > 0
