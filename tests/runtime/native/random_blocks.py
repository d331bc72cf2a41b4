"""Random GGUF block weights of any kind the native kernels take, for tests of blockdot.c and qdot.c."""

from __future__ import annotations

import numpy as np
import torch

from radixcache.runtime.model.block_linear import BLOCK_BYTES, BLOCK_ELEMS, BlockWeight

KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# Offsets of the float16 fields of each kind's block (d, and the minimum of Q4_1 / Q5_1 / the K-quants' dmin).
HALF_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2)}
HALF_FIELDS.update({"Q5_K": (0, 2), "Q6_K": (208,)})


def random_blocks(kind: str, rows: int, cols: int, seed: int) -> BlockWeight:
    """Random bytes with finite float16 scales (random signs for d; Q6_K's int8 scales are random bytes too)."""
    rng = np.random.default_rng(seed)
    nbytes = BLOCK_BYTES[kind]
    raw = rng.integers(0, 256, (rows * cols // BLOCK_ELEMS[kind], nbytes), dtype=np.uint8)
    for i, offset in enumerate(HALF_FIELDS[kind]):
        low, high = (0.002, 0.03) if i == 0 else (0.01, 0.2)
        half = (rng.uniform(low, high, len(raw)) * rng.choice([-1.0, 1.0], len(raw))).astype("<f2")
        if kind.endswith("_K") and i == 1:
            half = np.abs(half)
        raw[:, offset : offset + 2] = half.view(np.uint8).reshape(-1, 2)
    return BlockWeight(kind, torch.from_numpy(raw.reshape(rows, -1)), cols)
