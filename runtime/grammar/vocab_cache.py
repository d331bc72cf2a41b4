"""The grammar vocabulary's `TokenTable` (every token's bytes, the special ids) kept on disk between starts.

Reading it token by token is ~0.2 s of Python for SmolLM2's 49,152 tokens, and every engine did it at start,
holding the GIL against the first requests' steps. The table is kept in `$RADIXCACHE_VOCAB_CACHE` (a folder; `off`
keeps none), else `$XDG_CACHE_HOME/radixcache/grammar` (an absolute one), else `~/.cache/radixcache/grammar`, as
`vocab-<key>.bin`: the key hashes the tokenizer's whole definition (its `tokenizers` JSON: vocabulary, merges,
added tokens, decoder), llguidance's version and this file's `FORMAT`, so another tokenizer or library finds
another file. Loading one takes milliseconds.

A file that is corrupt (cut short, its checksum wrong, another key or count inside) is ignored and rebuilt over; one
that cannot be written (a read-only or missing folder, no home) is skipped: the table is then read from the tokenizer
each start, as before. Files are written whole through runtime/atomic_file.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from array import array
from pathlib import Path
from typing import TYPE_CHECKING

import llguidance

from radixcache.runtime.atomic_file import write_bytes
from radixcache.runtime.grammar.vocab import TokenTable, token_table

if TYPE_CHECKING:
    from radixcache.runtime.loading.tokenizer import Tokenizer

FORMAT = 1  # raise when what `token_table` reads changes (Tokenizer.token_bytes): earlier files then miss
MAGIC = b"radixcache grammar vocabulary\n"
ENV = "RADIXCACHE_VOCAB_CACHE"


def cache_dir() -> Path | None:
    """Where the tables are kept, or None: `$RADIXCACHE_VOCAB_CACHE` is `off`, or no folder is named (no home)."""
    named = os.environ.get(ENV, "")
    if named.lower() in ("off", "0", "none"):
        return None
    if named:
        return Path(named)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "radixcache" / "grammar"
    try:
        return Path.home() / ".cache" / "radixcache" / "grammar"
    except RuntimeError:  # no HOME and no passwd entry (a container under an arbitrary uid)
        return None


def table_key(tokenizer: Tokenizer) -> str:
    """The identity of `tokenizer`'s table: its definition, llguidance's version and `FORMAT` (~35 ms for
    SmolLM2's)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{FORMAT}\0{getattr(llguidance, '__version__', '')}\0{tokenizer.vocab_size}\0".encode())
    h.update(tokenizer.backend.to_str().encode("utf-8", "surrogatepass"))
    if shadowed := getattr(tokenizer, "shadowed", None):  # ids the backend lacks: which text each stands for
        h.update(repr(sorted(shadowed.items())).encode())
    return h.hexdigest()


def cached_table(tokenizer: Tokenizer) -> TokenTable:
    """`tokenizer`'s `TokenTable`: from its file where one is there and sound, else read from the tokenizer and
    written for the next start (where the folder can be written)."""
    folder = cache_dir()
    if folder is None:
        return token_table(tokenizer)
    key = table_key(tokenizer)
    path = folder / f"vocab-{key}.bin"
    table = read_table(path, key, tokenizer.vocab_size)
    if table is None:
        table = token_table(tokenizer)
        with contextlib.suppress(OSError):  # read-only, full, or not a folder: the next start reads it again
            folder.mkdir(parents=True, exist_ok=True)
            write_bytes(path, encode_table(table, key))
    return table


def encode_table(table: TokenTable, key: str) -> bytes:
    """The file of `table`: MAGIC, a JSON line (key, count, special ids, the body's checksum), then the body: each
    token's length (uint32 little-endian) and all the bytes."""
    lengths = array("I", (len(b) for b in table.plain))
    if sys.byteorder != "little":
        lengths.byteswap()
    body = lengths.tobytes() + b"".join(table.plain)
    head = {
        "key": key,
        "count": len(table.plain),
        "special": list(table.special),
        "sum": hashlib.blake2b(body, digest_size=16).hexdigest(),
    }
    return MAGIC + json.dumps(head).encode() + b"\n" + body


def read_table(path: Path, key: str, count: int) -> TokenTable | None:
    """The table in `path` if it is there, whole, and of `key` with `count` tokens; None otherwise."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        return _decode(data, key, count)
    except (ValueError, TypeError, KeyError, OverflowError):
        return None


def _decode(data: bytes, key: str, count: int) -> TokenTable | None:
    if not data.startswith(MAGIC):
        return None
    end = data.index(b"\n", len(MAGIC))
    head = json.loads(data[len(MAGIC) : end])
    body = memoryview(data)[end + 1 :]
    if head["key"] != key or head["count"] != count or len(body) < 4 * count:
        return None
    if hashlib.blake2b(body, digest_size=16).hexdigest() != head["sum"]:
        return None
    lengths = array("I")
    lengths.frombytes(body[: 4 * count])
    if sys.byteorder != "little":
        lengths.byteswap()
    if 4 * count + sum(lengths) != len(body):
        return None
    special = tuple(int(i) for i in head["special"])
    if any(not 0 <= i < count for i in special):
        return None
    plain, pos = [], 4 * count
    for n in lengths:
        plain.append(bytes(body[pos : pos + n]))
        pos += n
    return TokenTable(tuple(plain), special)
