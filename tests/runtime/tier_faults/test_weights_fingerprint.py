"""The disk tier's weights fingerprint covers every byte of the checkpoint: a checkpoint changed in one tensor, at
the same size and outside the 1 MiB samples the fingerprint used to read, gets zero disk hits (and outputs equal a
no-cache engine's on the changed weights); each file's digest is cached by its identity, so a second start reads no
weights, and an edit that keeps the size and resets the mtime is still seen (the ctime changes).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from radixcache.runtime.kv.tier.digest_cache import DigestCache
from radixcache.runtime.kv.tier.fingerprint import file_digest

MIB = 1 << 20
OLD = 1_500_000_000  # an mtime long past: the file is settled, so its digest is cached


def _old_samples(size: int) -> list[tuple[int, int]]:
    """The byte ranges the sampled fingerprint read: 16 spread 1 MiB samples and the last MiB."""
    offsets = {min(max(size - MIB, 0), i * size // 16) for i in range(16)} | {max(size - MIB, 0)}
    return [(o, o + MIB) for o in sorted(offsets)]


def _outside_samples(size: int, start: int, end: int) -> int | None:
    """A byte offset in [start, end) that no sample covers, or None."""
    for offset in range(start, end, 64):
        if all(not a <= offset < b for a, b in _old_samples(size)):
            return offset
    return None


def _overlaps_samples(size: int, start: int, end: int) -> bool:
    return any(a < end and start < b for a, b in _old_samples(size))


@pytest.fixture(autouse=True)
def digest_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "digests"
    monkeypatch.setenv("RADIXCACHE_DIGEST_CACHE", str(folder))
    return folder


def test_one_byte_outside_the_old_samples_changes_the_digest(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(os.urandom(3 * MIB) * 8)  # 24 MiB
    os.utime(path, (OLD, OLD))
    before = file_digest(str(path))
    offset = _outside_samples(24 * MIB, 0, 24 * MIB)
    assert offset is not None
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 1]))
    os.utime(path, (OLD, OLD))  # same size, same mtime: only the ctime tells
    assert path.stat().st_size == 24 * MIB
    assert file_digest(str(path)) != before


def test_a_settled_file_is_read_once_then_named_from_the_cache(tmp_path: Path, digest_cache: Path) -> None:
    path = tmp_path / "weights.safetensors"
    path.write_bytes(os.urandom(MIB))
    os.utime(path, (OLD, OLD))
    first = DigestCache(str(digest_cache))
    one = first.content_digest(str(path))
    second = DigestCache(str(digest_cache))
    assert second.content_digest(str(path)) == one and (first.hashed, second.hashed) == (1, 0)
    fresh = tmp_path / "fresh.safetensors"  # modified just now: hashed, but not cached (racily clean)
    fresh.write_bytes(b"x" * 100)
    DigestCache(str(digest_cache)).content_digest(str(fresh))
    again = DigestCache(str(digest_cache))
    again.content_digest(str(fresh))
    assert again.hashed == 1
    for entry in digest_cache.iterdir():  # a garbled entry is recomputed, never trusted
        entry.write_text("{not json")
    garbled = DigestCache(str(digest_cache))
    assert garbled.content_digest(str(path)) == one and garbled.hashed == 1


def test_the_digest_cache_stays_bounded_and_keeps_other_files(tmp_path: Path, digest_cache: Path, monkeypatch) -> None:
    import radixcache.runtime.kv.tier.digest_cache as dc

    monkeypatch.setattr(dc, "MAX_ENTRIES", 8)
    digest_cache.mkdir()
    (digest_cache / "README.txt").write_text("not an entry")
    files = []
    for i in range(20):
        path = tmp_path / f"shard-{i}.bin"
        path.write_bytes(bytes([i]) * 100)
        os.utime(path, (OLD, OLD))
        files.append(path)
        DigestCache(str(digest_cache)).content_digest(str(path))
    entries = [p for p in digest_cache.iterdir() if p.suffix == ".json"]
    assert 4 <= len(entries) <= 8
    assert (digest_cache / "README.txt").read_text() == "not an entry"
    newest = DigestCache(str(digest_cache))
    newest.content_digest(str(files[-1]))
    assert newest.hashed == 0  # the newest entries are the ones kept


def test_a_digest_entry_is_synced_and_a_killed_writers_leftover_goes(
    tmp_path: Path, digest_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry was written beside itself as `<key>.json.<pid>-<hex>.tmp` and renamed unsynced; a start killed
    mid-write left that file in the cache folder for good (the pruning only counts and removes entries). Now the
    entry is fsynced before its rename and the folder after, and a dead writer's staging file of the entry goes
    with its next write."""
    path = tmp_path / "weights.safetensors"
    path.write_bytes(b"w" * 1000)
    os.utime(path, (OLD, OLD))
    first = DigestCache(str(digest_cache))
    first.content_digest(str(path))
    (entry,) = digest_cache.iterdir()
    entry.write_text("{not json")  # damaged: recomputed and written again
    leftover = digest_cache / f".{entry.name}.4194399-0123abcd.partial"  # no process has pid 4194399
    leftover.write_text('{"ver')
    real_fsync = os.fsync
    synced: list[tuple[int, str]] = []  # (the descriptor's inode, what the entry held then)

    def watching(fd: int) -> None:
        synced.append((os.fstat(fd).st_ino, entry.read_text()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", watching)
    again = DigestCache(str(digest_cache))
    assert again.content_digest(str(path)) == first.content_digest(str(path)) and again.hashed == 1
    assert synced == [(entry.stat().st_ino, "{not json"), (digest_cache.stat().st_ino, entry.read_text())]
    assert [p.name for p in digest_cache.iterdir()] == [entry.name]


def _write_checkpoint(directory: Path, vocab: int) -> Path:
    """The tiny checkpoint of the CLI tests, with a vocabulary large enough that the file spans many samples."""
    import torch
    from safetensors.torch import save_file

    from radixcache.runtime.testing import random_weights, tiny_config
    from tests.cli.conftest import write_tiny_checkpoint

    write_tiny_checkpoint(directory)
    config_path = directory / "config.json"
    hf = json.loads(config_path.read_text())
    hf["vocab_size"] = vocab
    config_path.write_text(json.dumps(hf))
    config = tiny_config(vocab_size=vocab, max_position=4096, name="tiny")
    weights = {k: v.contiguous().to(torch.float32) for k, v in random_weights(config, seed=3).items()}
    save_file(weights, str(directory / "model.safetensors"))
    return directory / "model.safetensors"


def _tensor_range(path: Path, name: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    start, end = header[name]["data_offsets"]
    return 8 + n + start, 8 + n + end


@pytest.mark.slow
def test_a_checkpoint_changed_outside_the_samples_gets_zero_disk_hits(tmp_path: Path) -> None:
    from radixcache.runtime import Engine

    model_dir = tmp_path / "model"
    st = _write_checkpoint(model_dir, vocab=160_000)
    size = st.stat().st_size
    assert size > 17 * MIB
    row = 32 * 4  # hidden 32, float32
    start, _ = _tensor_range(st, "model.embed_tokens.weight")
    token = next(t for t in range(256) if not _overlaps_samples(size, start + t * row, start + (t + 1) * row))
    prompt = [token, *range(40, 80)] * 2  # every page after the first token depends on its embedding
    cache_dir = tmp_path / "kv"
    opts = {"page_size": 4, "capacity_blocks": 200, "dtype": "float32"}
    with Engine(str(model_dir), cache_dir=cache_dir, **opts) as first:
        first.generate(prompt, max_new_tokens=2)
        assert first.flush(30)
    with open(st, "r+b") as f:  # one tensor changed: the token's embedding row, same size, outside every sample
        f.seek(start + token * row)
        f.write(struct.pack("<8f", *([3.0] * 8)))
    assert st.stat().st_size == size
    with Engine(str(model_dir), enable_cache=False, **opts) as plain:
        want = plain.generate(prompt, max_new_tokens=2).token_ids
    with Engine(str(model_dir), cache_dir=cache_dir, **opts) as changed:
        got = changed.generate(prompt, max_new_tokens=2)
        assert changed.stats.tiers.disk_hit_tokens == 0 and got.cached_tokens == 0
        assert got.token_ids == want
