"""A test-only K-quant encoder (numpy): the `gguf` package (0.19) dequantises Q4_K / Q5_K / Q6_K but cannot
quantise them, so the tests and the SmolLM2 Q4_K_M-like file make their own blocks here.

The rules are simple ones (each sub-block's scale from its range, no search for the best scale as llama.cpp's
make_qkx2_quants does): the files are valid K-quant files whose values are a little further from the float weights
than llama.cpp's would be. What the tests hold them to is the layout: radixcache's dequantiser and the `gguf`
package's must read the same values from these bytes.

`quantize(x, kind)` encodes float32 `x` (last dimension a multiple of the block length) as ggml bytes of any kind
the kernels take: the 32-element kinds through `gguf.quants.quantize`, the K-quants here.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize

K_KINDS = ("Q4_K", "Q5_K", "Q6_K")


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b, 0 where b is 0."""
    return np.divide(a, b, out=np.zeros(np.broadcast_shapes(a.shape, b.shape), np.float32), where=b != 0)


def _q45_k(x: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[n, 8, 32] -> (d f16 [n], dmin f16 [n], sc [n, 8], m [n, 8], q [n, 8, 32] in 0..top)."""
    lo = np.minimum(x.min(axis=2), 0.0)
    scale = (x.max(axis=2) - lo) / top
    d, dmin = _f16(scale.max(axis=1) / 63), _f16(-lo.min(axis=1) / 63)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(_div(scale, d32)), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_div(-lo, dmin32)), 0, 63).astype(np.uint8)
    step, low = (d32 * sc)[:, :, None], (dmin32 * m)[:, :, None]
    q = np.clip(np.rint(_div(x + low, step)), 0, top).astype(np.uint8)
    return d, dmin, sc, m, q


def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12 bytes of 8 6-bit scales and mins (the inverse of dequant.k_scales_mins)."""
    return np.concatenate(
        [
            sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
            m[:, :4] | ((m[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4),
        ],
        axis=1,
    ).astype(np.uint8)


def _q4_k(x: np.ndarray) -> bytes:
    d, dmin, sc, m, q = _q45_k(x.reshape(-1, 8, 32), 15)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)
    dt = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (128,))])
    b = np.zeros(len(d), dt)
    b["d"], b["dmin"], b["scales"], b["qs"] = d, dmin, _pack_scales(sc, m), qs
    return b.tobytes()


def _q5_k(x: np.ndarray) -> bytes:
    d, dmin, sc, m, q = _q45_k(x.reshape(-1, 8, 32), 31)
    low = q & 15
    qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(-1, 128)
    qh = ((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)  # bit s of qh[l]
    dt = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qh", "u1", (32,)), ("qs", "u1", (128,))])
    b = np.zeros(len(d), dt)
    b["d"], b["dmin"], b["scales"], b["qh"], b["qs"] = d, dmin, _pack_scales(sc, m), qh, qs
    return b.tobytes()


def _q6_k(x: np.ndarray) -> bytes:
    g = x.reshape(-1, 16, 16)
    scale = np.abs(g).max(axis=2) / 31
    d = _f16(scale.max(axis=1) / 127)
    d32 = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(_div(scale, d32)), -128, 127).astype(np.int8)
    step = (d32 * sc)[:, :, None]
    q = (np.clip(np.rint(_div(g, step)), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # half, group, l
    low, high = q & 15, q >> 4
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    dt = np.dtype([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", "<f2")])
    b = np.zeros(len(d), dt)
    b["ql"], b["qh"], b["scales"], b["d"] = ql.reshape(-1, 128), qh.reshape(-1, 64), sc, d
    return b.tobytes()


def quantize(x: np.ndarray, kind: str) -> np.ndarray:
    """float32 `x` [..., cols] -> uint8 [..., cols / block * block bytes]: ggml's bytes of `kind`."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if kind not in K_KINDS:
        return gguf_quantize(x, GGMLQuantizationType[kind])
    if x.shape[-1] % 256:
        raise ValueError(f"{kind} rows hold whole super-blocks of 256; {x.shape[-1]} columns is not a multiple")
    raw = {"Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}[kind](x.reshape(-1, 256))
    return np.frombuffer(raw, dtype=np.uint8).reshape(*x.shape[:-1], -1).copy()


INT16_TOP = 256 * 127 + 127  # qdot.c's 16-bit activations: |v| <= 32639 (two int8 planes, base 256)


def quantised_activations(x: np.ndarray, top: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """What the quantised-activation kernels (runtime/native/qdot.c) make of float32 activations `x` [t, cols],
    computed here independently: per 32 values d = max|x| / top and q = round-half-even(x / d) in float32 (top 127:
    int8, qdot_matmul; INT16_TOP: 16-bit, qdot16_matmul). Returns the values it multiplies (q * d) and each value's
    rounding bound (d / 2), both float64 [t, cols]."""
    xb = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    d = np.abs(xb).max(axis=2, keepdims=True) / np.float32(top)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.rint(xb * inv)
    assert np.abs(q).max() <= top
    seen = (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)
    return seen, np.broadcast_to(d / 2, xb.shape).reshape(x.shape).astype(np.float64)
