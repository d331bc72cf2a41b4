"""ggml tensor types, and their decoding to float32 with numpy (whole blocks at a time, no Python loops).

Block layouts (little-endian), 32 elements per block:
    Q8_0: f16 d, i8 q[32]                 x = d * q
    Q4_0: f16 d, u8 qs[16]                x = d * (q - 8)
    Q4_1: f16 d, f16 m, u8 qs[16]         x = d * q + m
where q[j] is the low nibble of qs[j] and q[16 + j] its high nibble.
"""

from __future__ import annotations

import numpy as np

# ggml tensor types: id -> (name, elements per block, bytes per block). Only some can be dequantised (below);
# the rest are listed so that any file can be indexed and its unsupported tensors named in errors.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    30: ("BF16", 1, 2),
}
GGML_TYPE_IDS = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}


_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
_Q4_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))])
_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] packed bytes -> [n, 32] values: element j is the low nibble of byte j, element 16+j the high one."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Decode `raw` (the tensor's bytes) of `ggml_type` into a new float32 array of `shape`."""
    name = GGML_TYPES.get(ggml_type, (f"type {ggml_type}",))[0]
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if name == "F32":
        out = raw.view("<f4").astype(np.float32)  # copies, detaching from the map
    elif name == "F16":
        out = raw.view("<f2").astype(np.float32)
    elif name == "BF16":
        out = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    elif name == "Q8_0":
        b = raw.view(_Q8_0)
        out = b["qs"].astype(np.float32) * b["d"].astype(np.float32)[:, None]
    elif name == "Q4_0":
        b = raw.view(_Q4_0)
        q = _nibbles(b["qs"]).astype(np.int8) - np.int8(8)
        out = q.astype(np.float32) * b["d"].astype(np.float32)[:, None]
    elif name == "Q4_1":
        b = raw.view(_Q4_1)
        out = _nibbles(b["qs"]).astype(np.float32)
        out *= b["d"].astype(np.float32)[:, None]
        out += b["m"].astype(np.float32)[:, None]
    else:
        raise NotImplementedError(f"dequantising GGML type {name} is not supported (Q4_0, Q4_1, Q8_0, F16, BF16, F32)")
    return out.reshape(shape)
