"""The disk tier's page file (radixcache.runtime.kv.tier.disk_format), written by the store: the documented layout
byte for byte, token ids beyond int32 stored as int64, and what cannot be encoded refused at `put`.
"""

from __future__ import annotations

import hashlib
import json
import struct

import pytest

from radixcache.runtime.kv.tier.disk_format import MAGIC
from tests.runtime.conftest import FP, META, h, page_path, payload, toks, write


def test_the_file_format_is_the_documented_one(open_store) -> None:
    store = open_store()
    write(store, 5)
    data = page_path(store, h(5)).read_bytes()
    assert data[:8] == MAGIC
    assert data[8:40] == hashlib.blake2b(data[40:], digest_size=32).digest()
    version, header_len = struct.unpack_from("<II", data, 40)
    header = json.loads(data[48 : 48 + header_len])
    assert version == 1
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
