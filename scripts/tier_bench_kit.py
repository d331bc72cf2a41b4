"""What bench_tiers.py and bench_tier_prefetch.py share: the engine options every measured engine takes, and the
random prompts they measure with."""

from __future__ import annotations

import random
from typing import Any

import torch


def fixed_threads() -> dict[str, Any]:
    """Every engine runs this process's torch threads (`--threads`), fixed: the adaptive policy would change the
    count with the machine's load in the middle of a comparison; and the fixed kernel rules: a kernel measurement at
    each engine's start runs on some engines and not others (it stops on a busy machine)."""
    return {"threads": torch.get_num_threads(), "thread_policy": "fixed", "kernels": "fixed"}


def random_prompt(vocab: int, n: int, seed: int) -> list[int]:
    """`n` token ids drawn from `1 .. vocab - 1` by `seed`."""
    rng = random.Random(seed)
    return [rng.randrange(1, vocab) for _ in range(n)]
