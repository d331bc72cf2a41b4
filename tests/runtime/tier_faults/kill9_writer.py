"""The writer that tests/runtime/tier_faults/test_kill9_writes.py kills: pages derived from their hashes, written
through the real DiskStore until the process is killed.

Run as a module (`python -m tests.runtime.tier_faults.kill9_writer`, from the repository root), it is a small fork
server: each JSON line `["start", directory, seed]` on its standard input forks a writer and answers its pid,
`["engine", directory, seed]` an engine serving with its disk tier in `directory` (`serve_forever`; torch and the
runtime are imported once, by the server, before its first engine: not once per engine);
`["wait", pid]` reaps that child and answers true if SIGKILL ended it. Forking the pytest worker instead copies the
page tables of the models it holds: about 0.25 s a fork where a worker holds 6 GB, against a few milliseconds
from this process (50 kills: 13 s against under 3 s)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sys
from pathlib import Path

from radixcache.runtime.kv.tier.disk_store import DiskStore

FP = "kill9/float32/page4"
META = {"dtype": "float32", "shape": [1, 2, 4, 1, 8]}
PAGES = 300  # distinct pages the writers draw from
MAX_BYTES = 120 * 1500  # the store evicts too, while it is killed


def page_hash(i: int) -> bytes:
    return hashlib.blake2b(f"page {i}".encode(), digest_size=16).digest()


def tokens(h: bytes) -> list[int]:
    return [int.from_bytes(h[k : k + 4], "little") for k in range(0, 16, 4)]


def payload(h: bytes) -> bytes:
    return hashlib.shake_256(h).digest(600 + h[0] * 4)


def write_forever(directory: Path, seed: int) -> None:
    """The child: open the store, then write batches of pages (some already there) until killed."""
    store = DiskStore(directory, max_bytes=MAX_BYTES, fingerprint=FP, max_pending=32)
    rng = random.Random(seed)
    while True:
        for _ in range(16):
            h = page_hash(rng.randrange(PAGES))
            store.put(h, tokens(h), payload(h), META)
        store.flush(1.0)


def serve_forever(directory: Path, seed: int) -> None:
    """The engine child: the tiny random model in float64, its disk tier in `directory`, generating for batches of
    four prompts behind one 64-token system prompt (prompts drawn from `seed`) until killed."""
    from radixcache.runtime import Engine
    from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

    m = tiny_model(seed=5)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    rng = random.Random(seed)
    vocab = m.config.vocab_size
    system = [rng.randrange(vocab) for _ in range(64)]
    with Engine(model, capacity_blocks=120, page_size=4, dtype="float64", cache_dir=str(directory)) as engine:
        while True:
            engine.generate([system + [rng.randrange(vocab) for _ in range(60)] for _ in range(4)], max_new_tokens=2)


def serve() -> None:
    """The fork server's loop (the module docstring), until its standard input closes."""
    children = {"start": write_forever, "engine": serve_forever}
    for line in sys.stdin:
        command, *args = json.loads(line)
        if command in children:
            if command == "engine":
                import radixcache.runtime.testing  # noqa: F401  (once, here: each engine child starts imported)
            pid = os.fork()
            if pid == 0:  # the child: never returns into this loop
                try:
                    children[command](Path(args[0]), int(args[1]))
                finally:
                    os._exit(0)
            answer: object = pid
        else:
            _, status = os.waitpid(int(args[0]), 0)
            answer = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve()
