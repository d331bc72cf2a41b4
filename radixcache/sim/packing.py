"""Requests packed for the read-ahead pipe: a batch's token ids cross as one buffer, not as pickled ints.

Unpickling a token id creates a Python int. For a chat trace's requests of about 1,270 tokens that cost the
replay's process more than reading the lines had cost the reader (15.4 s to unpickle the 120,000-request chat
trace's 152 million ids, against 13 s to read them), which is why token traces used not to be read ahead at all.
Packed, a batch's ids become one int64 buffer (narrowed to 16 or 32 bits when every id of the batch fits, which the
pipe then carries at a quarter or half the bytes), and the replay gets each request's prompt and output back as
int64 arrays, which the tree takes without a conversion (`radixcache.tokens.as_token_array` copies an int64 array
and checks its signs in C).

Requests come out equal to what went in, field for field, except that `prompt` and a non-empty `output` are
`array('q')` instead of tuples (an empty output stays `()`). A request holding an id that int64 cannot hold crosses
as it is.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from typing import NamedTuple

from radixcache.tokens import TOKEN_TYPECODE, int64_packer
from radixcache.trace.workload import SimRequest

_WIDTH = 8  # bytes per int64


class PackedRequests(NamedTuple):
    """A batch of requests without their ids (`fields`: each request's fields, with the lengths of its prompt and
    output in place of the ids, or the request itself when its ids could not be packed), and the packed ids of all of
    them, in order, as one buffer of `typecode` ints."""

    fields: list[tuple]
    typecode: str
    ids: bytes


class RequestPacker:
    """Packs requests one by one as the reader makes them (`add`), so that a batch waiting to be sent holds bytes,
    not Python ints: holding 256 requests' ints, then freeing them at once, made the allocator hand whole arenas back
    to the system and fault them in again: reading the chat trace took 18.6 s so, against 12.9 s."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._fields: list[tuple] = []

    def __len__(self) -> int:
        return len(self._fields)

    def add(self, request: SimRequest) -> None:
        r = request
        try:
            prompt = _packed(r.prompt)
            output = _packed(r.output) if r.output else b""
        except (struct.error, TypeError):  # an id int64 cannot hold: this request crosses as it is
            self._fields.append(r)
            return
        self._parts.append(prompt)
        if output:
            self._parts.append(output)
        self._fields.append((r.timestamp_ms, len(r.prompt), len(r.output), *r[3:]))

    def take(self) -> PackedRequests:
        """The requests added since the last `take`, as one batch."""
        import numpy as np  # here, not at import: the CLI loads this module on every run

        ids = np.frombuffer(b"".join(self._parts), dtype=np.int64)
        fields = self._fields
        self._parts, self._fields = [], []
        typecode = TOKEN_TYPECODE
        if ids.size and int(ids.min()) >= 0:
            top = int(ids.max())
            if top < 1 << 16:
                typecode, ids = "H", ids.astype(np.uint16)
            elif top < 1 << 32:
                typecode, ids = "I", ids.astype(np.uint32)
        return PackedRequests(fields, typecode, ids.tobytes())


def _packed(ids: Sequence[int]) -> bytes:
    """The ids as int64 bytes: an int64 array's own (a token trace's reader makes them), else packed."""
    if type(ids) is array and ids.typecode == TOKEN_TYPECODE:
        return ids.tobytes()
    return int64_packer(len(ids))(*ids)


def unpack_requests(batch: PackedRequests) -> list[SimRequest]:
    """The requests of a batch a RequestPacker made, with int64 arrays for their ids."""
    import numpy as np

    ids = np.frombuffer(batch.ids, dtype=np.dtype(batch.typecode))
    if batch.typecode != TOKEN_TYPECODE:
        ids = ids.astype(np.int64)
    raw = memoryview(ids).cast("B")
    out = []
    at = 0
    for fields in batch.fields:
        if type(fields) is SimRequest:  # crossed as it was
            out.append(fields)
            continue
        timestamp_ms, prompt_len, output_len, *rest = fields
        prompt = array(TOKEN_TYPECODE)
        end = at + prompt_len * _WIDTH
        prompt.frombytes(raw[at:end])
        at = end
        output: array | tuple = ()
        if output_len:
            output = array(TOKEN_TYPECODE)
            end = at + output_len * _WIDTH
            output.frombytes(raw[at:end])
            at = end
        out.append(SimRequest(timestamp_ms, prompt, output, *rest))  # type: ignore[arg-type]
    return out
