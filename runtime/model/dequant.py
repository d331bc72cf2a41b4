"""ggml tensor types, and their decoding to float32 with numpy (whole blocks at a time, no Python loops).

Block layouts (little-endian; ggml's `block_*` structs), 32 elements per block:
    Q8_0: f16 d, i8 q[32]                          x = d * q
    Q4_0: f16 d, u8 qs[16]                         x = d * (q - 8)
    Q4_1: f16 d, f16 m, u8 qs[16]                  x = d * q + m
    Q5_0: f16 d, u32 qh, u8 qs[16]                 x = d * (q - 16)
    Q5_1: f16 d, f16 m, u32 qh, u8 qs[16]          x = d * q + m
where q[j] is the low nibble of qs[j] and q[16 + j] its high nibble; Q5 types add bit j of qh as bit 4 of q[j].

K-quants, super-blocks of 256 elements:
    Q4_K: f16 d, f16 dmin, u8 scales[12], u8 qs[128]             x = (d * sc[s]) * q - (dmin * m[s])
    Q5_K: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]  the same with a fifth bit from qh
    Q6_K: u8 ql[128], u8 qh[64], i8 scales[16], f16 d            x = (d * scales[e / 16]) * (q - 32)
    Q4_K / Q5_K: sub-block s (0..7) is 32 elements with a 6-bit scale sc[s] and a 6-bit min m[s], packed in 12
    bytes: for s < 4, sc = b[s] & 63 and m = b[s + 4] & 63; for s >= 4, sc = (b[s + 4] & 15) | (b[s - 4] >> 6) << 4
    and m = (b[s + 4] >> 4) | (b[s] >> 6) << 4. Each 32 bytes of qs hold sub-blocks 2i (low nibbles) and 2i + 1
    (high nibbles); Q5_K's bit 4 of element l in sub-block s is bit s of qh[l].
    Q6_K: each half of 128 elements takes 64 bytes of ql and 32 of qh; element l < 32 of its four 32-element
    groups g is ql[l] (g 0), ql[l + 32] (g 1) low nibbles, then the same bytes' high nibbles (g 2, 3), with bits
    2g, 2g + 1 of qh[l] as its bits 4 and 5.
The products are float32 in the order written (ggml's dequantize_row_* order), so the values equal ggml's bit for
bit (tests/runtime/loading/test_gguf_kquants.py checks them against the `gguf` package's dequantiser).
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
DEQUANTISABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")

_Q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
_Q4_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))])
_Q5_0 = np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))])
_Q5_1 = np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", (16,))])
_Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])
_Q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))])
_Q5_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qh", "u1", (32,)), ("qs", "u1", (128,))])
_Q6_K = np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2")])


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] packed bytes -> [n, 32] values: element j is the low nibble of byte j, element 16+j the high one."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """[n] u32 -> [n, 32] values 0 or 16: bit j of qh as bit 4 of element j."""
    return (((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 packed bytes per super-block [n, 12] -> (scales, mins), each [n, 8] uint8 (0..63)."""
    lo, mid, hi = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], axis=1)
    m = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return sc, m


def _k_sub_nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 128] -> [n, 8, 32]: sub-block 2i is the low nibbles of bytes 32i..32i+31, 2i + 1 their high nibbles."""
    q = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([q & 0x0F, q >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    sc, m = k_scales_mins(b["scales"])
    d = b["d"].astype(np.float32)[:, None] * sc.astype(np.float32)
    dm = b["dmin"].astype(np.float32)[:, None] * m.astype(np.float32)
    return d[:, :, None] * q.astype(np.float32) - dm[:, :, None]


def _q6_k(b: np.ndarray) -> np.ndarray:
    ql = b["ql"].reshape(-1, 2, 2, 32)  # half, byte group (ql[l], ql[l + 32]), l
    qh = b["qh"].reshape(-1, 2, 1, 32)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # [n, half, g, 32] for g = 0..3
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]) & 3
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    d = b["d"].astype(np.float32)[:, None] * b["scales"].astype(np.float32)  # [n, 16]
    return (d.reshape(-1, 16, 1) * q.reshape(-1, 16, 16).astype(np.float32)).reshape(-1, 256)


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
    elif name in ("Q4_0", "Q5_0"):
        b = raw.view(_Q4_0 if name == "Q4_0" else _Q5_0)
        q = _nibbles(b["qs"]) if name == "Q4_0" else _nibbles(b["qs"]) | _fifth_bits(b["qh"])
        q = q.astype(np.int8) - np.int8(8 if name == "Q4_0" else 16)
        out = q.astype(np.float32) * b["d"].astype(np.float32)[:, None]
    elif name in ("Q4_1", "Q5_1"):
        b = raw.view(_Q4_1 if name == "Q4_1" else _Q5_1)
        q = _nibbles(b["qs"]) if name == "Q4_1" else _nibbles(b["qs"]) | _fifth_bits(b["qh"])
        out = q.astype(np.float32)
        out *= b["d"].astype(np.float32)[:, None]
        out += b["m"].astype(np.float32)[:, None]
    elif name == "Q4_K":
        b = raw.view(_Q4_K)
        out = _q4_k(b, _k_sub_nibbles(b["qs"]))
    elif name == "Q5_K":
        b = raw.view(_Q5_K)
        high = (b["qh"][:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # [n, 8, 32]
        out = _q4_k(b, _k_sub_nibbles(b["qs"]) | (high << 4))
    elif name == "Q6_K":
        out = _q6_k(raw.view(_Q6_K))
    else:
        raise NotImplementedError(f"dequantising GGML type {name} is not supported ({', '.join(DEQUANTISABLE)})")
    return out.reshape(shape)
