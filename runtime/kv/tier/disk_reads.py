"""Reading one page file and checking it: the two reads the disk store serves (kv.tier.disk_store: `read`, whole, and
`read_into`, the payload straight into the caller's buffers). Each raises OSError for I/O and CorruptPage for a file
that fails a check (kv.tier.disk_format); the store decides what either means."""

from __future__ import annotations

from collections.abc import Sequence

from radixcache.runtime.kv.tier.disk_files import SplitRead, read_nofollow_into, read_nofollow_writable
from radixcache.runtime.kv.tier.disk_format import check_split_page_for, parse_page_for


def load_page(path: str, page_hash: bytes, tokens: Sequence[int]) -> tuple[memoryview, dict]:
    """The page's payload (a writable view of the bytes read) and meta."""
    page = parse_page_for(read_nofollow_writable(path), page_hash, tokens)
    return page.payload, page.meta


def load_page_into(
    path: str, page_hash: bytes, tokens: Sequence[int], payload: Sequence[memoryview], head: bytearray, split: SplitRead
) -> dict | None:
    """The page's meta, its payload read into `payload` by `split` (the rest of the file into `head`, and the
    checksum of its body when `split` made it); None for a sound page whose payload is not `payload`'s length."""
    got = split(path, head, payload)
    if got is not None:
        return check_split_page_for(got[0], payload, page_hash, tokens, got[1])
    page = parse_page_for(read_nofollow_into(path, head), page_hash, tokens)  # shorter than `payload`
    return page.meta if len(page.payload) == sum(len(p) for p in payload) else None
