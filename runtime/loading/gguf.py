"""A small GGUF (v2/v3) reader: metadata, a tensor index, memory-mapped tensor data and numpy dequantisation.

Layout (all little-endian):
    magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
    kv_count x (string key, u32 value_type, value)
    tensor_count x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset)
    padding to `general.alignment` (default 32) | tensor data (each tensor at data_start + offset)

A string is a u64 byte length followed by UTF-8 bytes. GGUF lists dims fastest-varying first (ggml's `ne`), so a
tensor's numpy shape is the reverse: a matrix with dims [in, out] is an array of shape [out, in].
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixcache.runtime.loading.weights import refuse_lfs_pointer
from radixcache.runtime.model.dequant import GGML_TYPE_IDS, GGML_TYPES, dequantize

__all__ = ["GGML_TYPES", "GGML_TYPE_IDS", "GGUFError", "GGUFFile", "TensorInfo", "dequantize", "tensor_nbytes"]

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types -> (struct format, size) for scalars.
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),  # UINT8
    1: ("<b", 1),  # INT8
    2: ("<H", 2),  # UINT16
    3: ("<h", 2),  # INT16
    4: ("<I", 4),  # UINT32
    5: ("<i", 4),  # INT32
    6: ("<f", 4),  # FLOAT32
    7: ("<?", 1),  # BOOL
    10: ("<Q", 8),  # UINT64
    11: ("<q", 8),  # INT64
    12: ("<d", 8),  # FLOAT64
}
_NUMPY_OF_SCALAR = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


class _Unreadable(GGUFError):
    """A value that cannot be read: the reader adds the file and what it was reading (key or tensor)."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One entry of the tensor index. `shape` is in numpy order (slowest-varying first)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, (f"type{self.ggml_type}", 0, 0))[0]

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


class GGUFFile:
    """A GGUF file opened for reading. Use as a context manager, or call `close()`.

    `metadata` maps keys to Python values (arrays of numbers as numpy arrays, arrays of strings as lists of str).
    `tensors` maps names to `TensorInfo`. `raw(name)` is a zero-copy uint8 view of the mapped data;
    `dequantize(name)` returns a fresh float32 array that outlives the file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            try:
                self._mm: mmap.mmap | None = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as e:  # empty file
                raise GGUFError(f"{self.path}: empty file, not GGUF") from e
        self._at = "the file header"  # what is being read: named by an error in the header, metadata or index
        try:
            self._parse()
        except GGUFError as e:
            self.close()
            if isinstance(e, _Unreadable):
                raise GGUFError(f"{self.path}: {e} (in {self._at})") from None
            raise
        except (struct.error, ValueError, IndexError, OverflowError, MemoryError, RecursionError) as e:
            # RecursionError: arrays of arrays nested deeper than Python recurses (12 bytes a level)
            self.close()
            raise GGUFError(f"{self.path}: truncated or corrupt GGUF header in {self._at} ({e})") from e

    # ------------------------------------------------------------------ public API

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view into the mapped file."""
        info = self.tensors[name]
        if info.ggml_type not in GGML_TYPES:
            raise NotImplementedError(f"{self.path}: tensor {name} has unknown GGML type {info.ggml_type}")
        return np.frombuffer(self._buffer(), dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as a new float32 array of shape `tensors[name].shape`."""
        info = self.tensors[name]
        return dequantize(self.raw(name), info.ggml_type, info.shape)

    def close(self) -> None:
        if self._mm is not None:
            with contextlib.suppress(BufferError):  # a raw() view is still alive; it closes when collected
                self._mm.close()
            self._mm = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ parsing

    def _buffer(self) -> mmap.mmap:
        if self._mm is None:
            raise ValueError(f"{self.path}: GGUF file is closed")
        return self._mm

    def _parse(self) -> None:
        mm = self._buffer()
        if mm[:4] != GGUF_MAGIC:
            try:
                refuse_lfs_pointer(self.path)
            except ValueError as e:  # a GGUFError, so that the reader's handler below does not wrap it
                raise GGUFError(str(e)) from None
            raise GGUFError(f"{self.path}: not a GGUF file (magic {bytes(mm[:4])!r})")
        (self.version,) = struct.unpack_from("<I", mm, 4)
        if self.version not in (2, 3):
            hint = " (big-endian files are not supported)" if self.version > 0xFFFF else ""
            raise GGUFError(f"{self.path}: GGUF version {self.version} is not supported, only 2 and 3{hint}")
        n_tensors, n_kv = struct.unpack_from("<QQ", mm, 8)
        self._pos = 24
        self.metadata: dict[str, Any] = {}
        for i in range(n_kv):
            self._at = f"metadata entry {i + 1} of {n_kv}, its key"
            key = self._string()
            self._at = f"metadata key {key!r} (entry {i + 1} of {n_kv})"
            if key in self.metadata:  # which one counts? llama.cpp and the gguf package refuse the file too
                raise GGUFError(f"{self.path}: metadata key {key!r} appears twice")
            (vtype,) = self._unpack("<I", 4)
            self.metadata[key] = self._value(vtype)
        index = []
        for i in range(n_tensors):
            self._at = f"tensor index entry {i + 1} of {n_tensors}, its name"
            name = self._string()
            self._at = f"tensor index entry {name!r} ({i + 1} of {n_tensors})"
            (n_dims,) = self._unpack("<I", 4)
            dims = self._unpack(f"<{n_dims}Q", 8 * n_dims)
            (ggml_type,) = self._unpack("<I", 4)
            (offset,) = self._unpack("<Q", 8)
            index.append((name, tuple(reversed(dims)), ggml_type, offset))
        self.alignment = _alignment(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT), self.path)
        self.data_offset = -(-self._pos // self.alignment) * self.alignment
        if index and self.data_offset > len(mm):  # 2**31 passed as a power of two: blamed on the first tensor
            raise GGUFError(
                f"{self.path}: metadata general.alignment is {self.alignment}: the tensor data would start at byte "
                f"{self.data_offset}, past the end of the file ({len(mm)} bytes)"
            )
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, ggml_type, offset in index:
            if name in self.tensors:
                raise GGUFError(f"{self.path}: tensor {name} appears twice in the tensor index")
            try:
                nbytes = tensor_nbytes(shape, ggml_type) if ggml_type in GGML_TYPES else 0
            except GGUFError as e:
                raise GGUFError(f"{self.path}: tensor {name}: {e}") from None
            start = self.data_offset + offset
            if ggml_type in GGML_TYPES and start + nbytes > len(mm):
                raise GGUFError(f"{self.path}: tensor {name} runs past the end of the file")
            self.tensors[name] = TensorInfo(name, shape, ggml_type, start, nbytes)

    def _unpack(self, fmt: str, size: int) -> tuple[Any, ...]:
        out = struct.unpack_from(fmt, self._buffer(), self._pos)
        self._pos += size
        return out

    def _string(self) -> str:
        mm = self._buffer()
        (n,) = struct.unpack_from("<Q", mm, self._pos)
        start = self._pos + 8
        self._pos = start + n
        if self._pos > len(mm):
            raise _Unreadable("string runs past the end of the file")
        return mm[start : self._pos].decode("utf-8", errors="replace")

    def _value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            fmt, size = _SCALARS[vtype]
            return self._unpack(fmt, size)[0]
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            (etype,) = self._unpack("<I", 4)
            (count,) = self._unpack("<Q", 8)
            least = _SCALARS[etype][1] if etype in _SCALARS else 8 if etype == _STRING else 12  # bytes an element takes
            if count * least > len(self._buffer()) - self._pos:  # refused before a list of 2**62 is begun
                raise _Unreadable(f"an array of {count} elements runs past the end of the file")
            if etype in _NUMPY_OF_SCALAR:
                dtype = np.dtype(_NUMPY_OF_SCALAR[etype])
                arr = np.frombuffer(self._buffer(), dtype=dtype, count=count, offset=self._pos).copy()
                self._pos += count * dtype.itemsize
                return arr
            if etype == _STRING:
                return self._strings(count)
            return [self._value(etype) for _ in range(count)]  # arrays of arrays
        raise _Unreadable(f"unknown metadata value type {vtype} at byte {self._pos}")

    def _strings(self, count: int) -> list[str]:
        # The hot loop for tokenizer vocabularies (~100k strings): plain struct + bytes slicing, no numpy per item.
        mm, pos, unpack = self._buffer(), self._pos, struct.Struct("<Q").unpack_from
        out = []
        append = out.append
        for _ in range(count):
            (n,) = unpack(mm, pos)
            pos += 8
            append(mm[pos : pos + n].decode("utf-8", errors="replace"))
            pos += n
        if pos > len(mm):  # a slice stops at the end, so a length past it is found only here
            raise _Unreadable("string runs past the end of the file")
        self._pos = pos
        return out


def _alignment(value: Any, path: str) -> int:
    """general.alignment as an int; GGUFError naming the key unless it is an integer that is a power of two (as
    llama.cpp requires): an array or a string was a TypeError or a "corrupt header" that named neither."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0 and not value & (value - 1):
        return int(value)
    raise GGUFError(f"{path}: metadata general.alignment is {value!r}, not a power of two")


def tensor_nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    """Bytes a tensor of `shape` (numpy order) and `ggml_type` takes. Rows must be whole blocks."""
    name, block, block_bytes = GGML_TYPES[ggml_type]
    n = math.prod(shape)
    if shape and shape[-1] % block:
        raise GGUFError(f"row length {shape[-1]} is not a multiple of the {name} block size {block}")
    return n // block * block_bytes
