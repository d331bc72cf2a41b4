"""The disk tier's page file format: one KV page per file, self-describing and checksummed.

This module only encodes and checks bytes; where files live, how they are written and when they are deleted is
the store's business (radixcache.runtime.kv.tier.disk_store). A page hash is opaque `bytes`, the payload plain
`bytes`, and `meta` a small JSON-able dict that only the runtime interprets.

Page file format (version 2; integers little-endian)::

    offset  size  field
    0       8     magic b"RCKVPAGE"
    8       32    checksum of every byte from offset 40 to the end of the file: XXH3-128 (16 bytes, big-endian as
                  xxhash's `digest()`) then 16 zero bytes; in version 1 files, blake2b (digest_size 32)
    40      4     u32 page format version (2; version 1 files are still read)
    44      4     u32 H, the header's length
    48      H     header, UTF-8 JSON: {"hash": hex, "fingerprint": str, "tokens": n, "token_width": 4 | 8,
                  "payload": payload length, "meta": {...}}
    48+H    n*w   the page's token ids, signed int32 (w = 4) or int64 (w = 8) when some id does not fit int32
    ...     P     the payload; the file ends exactly there

Any single flipped byte is detected: in the magic by the magic, in the checksum or after it by the checksum;
a truncated or extended file by the checksum and the exact length. The version is read before the checksum only to
choose its algorithm: a flipped version byte names another algorithm (or none), whose checksum then fails.

The checksum guards against accidents (a torn or flipped byte), not against someone who can write the directory:
it was blake2b in version 1, whose 1.1 ms per SmolLM2 page (737 KB) was most of a disk read; XXH3 takes 0.04 ms.
The directory's marker keeps its own version (`FORMAT_VERSION`, 1): both page versions live in one directory.
A page of a newer version, up to 255 (a newer radixcache sharing the directory wrote it), is not corrupt: `NewerPage`
says so, and the store leaves it in place, unread; a flipped version byte that makes one is not detected as corrupt.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

import xxhash

if TYPE_CHECKING:
    from radixcache.runtime.kv.pool import KVPool

__all__ = [
    "BODY_START",
    "DIGEST_SIZE",
    "FORMAT_VERSION",
    "HEADER_START",
    "INT32",
    "INT64",
    "MAGIC",
    "MAX_HASH_BYTES",
    "MAX_HEADER",
    "MAX_NEWER_VERSION",
    "PAGE_SUFFIX",
    "PAGE_VERSION",
    "PAGE_VERSIONS",
    "PREFIX",
    "TMP_SUFFIX",
    "CorruptPage",
    "NewerPage",
    "PageFile",
    "PageWrite",
    "check_split_page_for",
    "encode_page",
    "pack_tokens",
    "page_checksum",
    "parse_page",
    "parse_page_for",
    "parse_page_stream",
]

FORMAT_VERSION = 1  # the directory marker's version
PAGE_VERSION = 2  # what new page files are written as
PAGE_VERSIONS = (1, 2)  # what is read
PAGE_SUFFIX = ".kvpage"  # a page file's name: <hash hex>.kvpage
TMP_SUFFIX = ".tmp"  # a file being written, renamed into place when complete

MAGIC = b"RCKVPAGE"
DIGEST_SIZE = 32
PREFIX = struct.Struct("<II")  # version, header length
BODY_START = len(MAGIC) + DIGEST_SIZE  # 40: the checksum covers everything from here on
HEADER_START = BODY_START + PREFIX.size  # 48
MAX_HASH_BYTES = 64  # the file name is the hash in hex
MAX_HEADER = 1 << 20
MAX_NEWER_VERSION = 255  # a version above ours up to this is a later format's page; above it, a corrupt field
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


class PageWrite(NamedTuple):
    """A page ready to write: everything the file needs, already validated and serialized by `encode_page`.
    The file is MAGIC, `page_checksum(prefix, tokens, payload)`, prefix, tokens, payload."""

    page_hash: bytes
    prefix: bytes  # version + header length + header, the start of the checksummed body
    tokens: bytes
    payload: bytes
    size: int  # of the whole file
    used_ns: int | None = None  # the file's mtime (when it was queued: its use, not the writer's lag); None: now
    parent: bytes | None = None  # the hash of its run's page before it (None: it starts one), for its place in the LRU


class PageFile(NamedTuple):
    """A page file that passed every check of `parse_page`, split into its parts."""

    hash_hex: str
    fingerprint: str
    token_width: int
    tokens: bytes  # packed, as in the file
    meta: dict
    payload: memoryview  # of the data parsed (no copy: writable when that was a bytearray)


class CorruptPage(Exception):
    """A page file failed a check; the message says which."""


class NewerPage(CorruptPage):
    """A page file of a format version newer than this radixcache reads: unusable here, but not corrupt (a newer
    radixcache sharing the directory wrote it): it is not to be deleted."""


def pack_tokens(tokens: Sequence[int], width: int | None = None) -> tuple[bytes, int]:
    """Token ids as little-endian int32, or int64 when one does not fit (or `width` bytes when given).
    Raises ValueError for an id outside int64 (or outside `width`)."""
    ids = [int(t) for t in tokens]
    if width is None:
        width = 4 if all(INT32[0] <= t <= INT32[1] for t in ids) else 8
    try:
        return struct.pack(f"<{len(ids)}{'i' if width == 4 else 'q'}", *ids), width
    except struct.error:
        raise ValueError(f"token ids must fit in signed {width * 8}-bit integers") from None


def encode_page(page_hash: bytes, fingerprint: str, tokens: Sequence[int], payload: bytes, meta: dict) -> PageWrite:
    """Validate a page and serialize everything but the checksum. Raises TypeError / ValueError for bad input."""
    if not isinstance(page_hash, bytes) or not 1 <= len(page_hash) <= MAX_HASH_BYTES:
        raise ValueError(f"a page hash is 1 to {MAX_HASH_BYTES} bytes, got {page_hash!r:.80}")
    if not isinstance(payload, bytes):
        payload = bytes(payload)  # a copy: a bytearray the caller reuses must not change the queued write
    packed, width = pack_tokens(tokens)
    header = {
        "hash": page_hash.hex(),
        "fingerprint": fingerprint,
        "tokens": len(packed) // width,
        "token_width": width,
        "payload": len(payload),
        "meta": meta,
    }
    text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")  # TypeError if not JSON-able
    prefix = PREFIX.pack(PAGE_VERSION, len(text)) + text
    size = HEADER_START - PREFIX.size + len(prefix) + len(packed) + len(payload)
    return PageWrite(page_hash, prefix, packed, payload, size)


def page_checksum(*parts: bytes | memoryview, version: int = PAGE_VERSION) -> bytes:
    """The checksum field (DIGEST_SIZE bytes) of a page file of `version`: XXH3-128 of `parts`, concatenated (every
    byte from BODY_START to the end of the file), padded with zeros; blake2b-256 for version 1."""
    digest = xxhash.xxh3_128() if version == 2 else hashlib.blake2b(digest_size=DIGEST_SIZE)
    for part in parts:
        digest.update(part)
    return digest.digest().ljust(DIGEST_SIZE, b"\0")


def parse_page(data: bytes | bytearray | memoryview) -> PageFile:
    """Check a whole page file and split it. Raises CorruptPage naming the first check that failed."""
    view = memoryview(data)
    version = _version(view)
    if page_checksum(view[BODY_START:], version=version) != view[len(MAGIC) : BODY_START]:
        raise CorruptPage("checksum mismatch")
    hash_hex, fingerprint, width, tokens_at, payload_at, meta = _header(view, len(view))
    return PageFile(hash_hex, fingerprint, width, data[tokens_at:payload_at], meta, view[payload_at:])


def parse_page_stream(f: BinaryIO, size: int, chunk: int = 1 << 20) -> tuple[str, str]:
    """`parse_page`'s checks of a whole page file of `size` bytes read from `f` a `chunk` at a time, in memory
    bounded whatever the file's size (a huge file named like a page); its (hash hex, fingerprint). Raises
    CorruptPage naming the first check that failed, as `parse_page` does."""
    head = bytearray(f.read(HEADER_START))
    version = _version(memoryview(head))
    head += f.read(min(PREFIX.unpack_from(head, BODY_START)[1], MAX_HEADER))  # where `_header` looks
    digest = xxhash.xxh3_128() if version == 2 else hashlib.blake2b(digest_size=DIGEST_SIZE)
    digest.update(memoryview(head)[BODY_START:])
    while part := f.read(chunk):
        digest.update(part)
    if digest.digest().ljust(DIGEST_SIZE, b"\0") != head[len(MAGIC) : BODY_START]:
        raise CorruptPage("checksum mismatch")
    hash_hex, fingerprint, *_ = _header(memoryview(head), size)
    return hash_hex, fingerprint


def parse_page_for(data: bytes | bytearray | memoryview, page_hash: bytes, tokens: Sequence[int]) -> PageFile:
    """`parse_page`, and that the file holds the page asked for: the hash it records is `page_hash` and its token
    ids are `tokens` (a hash alone is never trusted). Raises CorruptPage naming the first check that failed."""
    page = parse_page(data)
    _check_identity(page.hash_hex, page.token_width, page.tokens, page_hash, tokens)
    return page


def check_split_page_for(
    head: memoryview,
    payload: Sequence[memoryview],
    page_hash: bytes,
    tokens: Sequence[int],
    xxh3: bytes | None = None,
) -> dict | None:
    """`parse_page_for` of a file read in two parts: `head`, everything before the payload, and `payload`, the
    buffers its payload was read into (kv.tier.disk_files.read_nofollow_split); `xxh3`, the XXH3-128 digest of its
    body when the read made it (used for a version 2 file; computed here otherwise). Returns the page's meta; None
    when the file passes its checksum but its payload is not exactly `payload`'s length (a page of another shape,
    which is not corrupt). Raises CorruptPage naming the first check that failed."""
    version = _version(head)
    if xxh3 is not None and version == 2:
        checksum = xxh3.ljust(DIGEST_SIZE, b"\0")
    else:
        checksum = page_checksum(head[BODY_START:], *payload, version=version)
    if checksum != head[len(MAGIC) : BODY_START]:
        raise CorruptPage("checksum mismatch")
    if HEADER_START + PREFIX.unpack_from(head, BODY_START)[1] > len(head):
        return None  # the header runs into the bytes read as payload: the payload is shorter
    hash_hex, _, width, tokens_at, payload_at, meta = _header(head, len(head) + sum(len(p) for p in payload))
    if payload_at != len(head):
        return None
    _check_identity(hash_hex, width, head[tokens_at:payload_at], page_hash, tokens)
    return meta


def _version(view: memoryview) -> int:
    """The page format version of a file that starts with `view`, after checking its length and magic."""
    if len(view) < HEADER_START:
        raise CorruptPage(f"truncated ({len(view)} bytes)")
    if view[: len(MAGIC)] != MAGIC:
        raise CorruptPage("bad magic")
    version = PREFIX.unpack_from(view, BODY_START)[0]
    if PAGE_VERSION < version <= MAX_NEWER_VERSION:
        raise NewerPage(f"page format version {version}, newer than this radixcache reads {PAGE_VERSIONS}")
    if version not in PAGE_VERSIONS:
        raise CorruptPage(f"page format version {version}, expected one of {PAGE_VERSIONS}")
    return version


def _header(view: memoryview, size: int) -> tuple[str, str, int, int, int, dict]:
    """The header of a page file of `size` bytes whose header lies in `view` (checksum already checked): hash hex,
    fingerprint, token width, where its tokens and its payload start, meta."""
    header_len = PREFIX.unpack_from(view, BODY_START)[1]
    if header_len > min(MAX_HEADER, size - HEADER_START):
        raise CorruptPage("header length out of range")
    try:
        header = json.loads(bytes(view[HEADER_START : HEADER_START + header_len]).decode("utf-8"))
        hash_hex, fingerprint = header["hash"], header["fingerprint"]
        n, width, payload_len, meta = header["tokens"], header["token_width"], header["payload"], header["meta"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptPage(f"bad header ({exc})") from None
    if not (
        isinstance(hash_hex, str)
        and isinstance(fingerprint, str)
        and isinstance(meta, dict)
        and width in (4, 8)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (n, payload_len))
    ):
        raise CorruptPage("bad header fields")
    tokens_at = HEADER_START + header_len
    payload_at = tokens_at + n * width
    if payload_at + payload_len != size:
        raise CorruptPage(f"length {size} does not match the header ({payload_at + payload_len})")
    return hash_hex, fingerprint, width, tokens_at, payload_at, meta


def _check_identity(
    hash_hex: str, width: int, stored: bytes | memoryview, page_hash: bytes, tokens: Sequence[int]
) -> None:
    """That a sound file holds the page asked for: its recorded hash and its packed token ids."""
    if hash_hex != page_hash.hex():
        raise CorruptPage(f"the file records hash {hash_hex:.64}")
    try:
        asked, _ = pack_tokens(tokens, width)
    except ValueError:
        asked = b""
    if asked != stored:
        raise CorruptPage("its tokens differ from the page's")


def page_meta(pool: KVPool) -> dict:
    """What a page file records of the pool it came from (its `meta`)."""
    return {"dtype": str(pool.dtype), "shape": [pool.num_layers, 2, pool.page_size, pool.kv_heads, pool.head_dim]}
