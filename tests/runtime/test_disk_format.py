"""The disk tier's page file (radixcache.runtime.kv.tier.disk_format), written by the store: the documented layout
byte for byte, version 1 files read by every read (tests.runtime.disk_split), token ids beyond int32 stored as
int64, and what cannot be encoded refused at `put`.
"""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import xxhash

from radixcache.runtime.kv.tier.disk_format import MAGIC
from tests.runtime.conftest import FP, META, h, page_path, payload, toks, write
from tests.runtime.disk_split import READS, Read


def test_the_file_format_is_the_documented_one(open_store) -> None:
    store = open_store()
    write(store, 5)
    data = page_path(store, h(5)).read_bytes()
    assert data[:8] == MAGIC
    assert data[8:40] == xxhash.xxh3_128(data[40:]).digest() + bytes(16)
    version, header_len = struct.unpack_from("<II", data, 40)
    header = json.loads(data[48 : 48 + header_len])
    assert version == 2
    assert header == {
        "hash": h(5).hex(),
        "fingerprint": FP,
        "tokens": 4,
        "token_width": 4,
        "payload": 256,
        "meta": META,
    }
    tokens_at = 48 + header_len
    assert list(struct.unpack_from("<4i", data, tokens_at)) == toks(5)
    assert data[tokens_at + 16 :] == payload(5)


def _as_version(data: bytes, version: int, checksum: bytes | None = None) -> bytes:
    body = struct.pack("<I", version) + data[44:]
    return data[:8] + (checksum if checksum is not None else hashlib.blake2b(body, digest_size=32).digest()) + body


@pytest.mark.parametrize("read", READS)
def test_version_1_files_checksummed_by_blake2b_are_still_read(read: Read, open_store) -> None:
    store = open_store()
    write(store, 5)
    path = page_path(store, h(5))
    path.write_bytes(_as_version(path.read_bytes(), 1))
    assert read(store, h(5), toks(5)) == (payload(5), META)
    assert store.stats().corrupt_pages == 0


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("version", [1, 0], ids=["v1-with-a-v2-checksum", "unknown-version"])
def test_a_version_that_does_not_match_its_checksum_is_corrupt(read: Read, open_store, version: int) -> None:
    """A version 1 file whose checksum is its body's XXH3 (what a native read computes as it reads) is corrupt:
    version 1 is checked with blake2b whatever the read made."""
    store = open_store()
    write(store, 5)
    path = page_path(store, h(5))
    data = path.read_bytes()
    path.write_bytes(_as_version(data, version, checksum=data[8:40]))  # the version field flipped, nothing else
    assert read(store, h(5), toks(5)) is None
    assert store.stats().corrupt_pages == 1 and not path.exists()


@pytest.mark.parametrize("read", READS)
def test_a_page_of_a_newer_format_is_skipped_and_left_in_place(read: Read, open_store) -> None:
    """A newer radixcache sharing the directory wrote it: a miss here, never deleted as corrupt (it was), and
    neither checked nor deleted by verify."""
    store = open_store()
    write(store, 5, 6)
    path = page_path(store, h(5))
    newer = _as_version(path.read_bytes(), 3, checksum=bytes(32))  # whatever checksum version 3 may use
    path.write_bytes(newer)
    assert read(store, h(5), toks(5)) is None
    assert store.stats().corrupt_pages == 0 and path.read_bytes() == newer
    assert store.count_prefix([h(5)]) == 0  # out of the index: not read again
    report = store.verify()
    assert (report.checked, report.ok, report.corrupt, report.removed) == (1, 1, (), 0)
    assert path.read_bytes() == newer
    assert read(store, h(6), toks(6)) == (payload(6), META)


def test_token_ids_beyond_int32_are_stored_as_int64(open_store) -> None:
    store = open_store()
    big = [2**40, 1, 2**62, -3]
    assert store.put(h(1), big, b"kv", META)
    assert store.flush(10)
    assert store.read(h(1), big) == (b"kv", META)
    assert store.read(h(1), [1, 1, 1, 1]) is None  # the tokens differ: deleted


def test_bad_arguments_raise_at_put(open_store) -> None:
    store = open_store()
    with pytest.raises(ValueError):
        store.put(b"", toks(0), b"x", META)
    with pytest.raises(ValueError):
        store.put(h(0), [2**63], b"x", META)
    with pytest.raises(TypeError):
        store.put(h(0), toks(0), b"x", {"dtype": object()})
    assert store.stats().pending_writes == 0
