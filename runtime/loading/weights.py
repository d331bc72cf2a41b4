"""The weight names and shapes a ModelConfig implies (Hugging Face names, [out, in] layout), and checks of a
config a file describes: its fields typed and in range, its head counts consistent; a Git LFS pointer left in place
of a model file refused as one."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from radixcache.runtime.config import ModelConfig, expected_shapes

__all__ = ["check_heads", "check_weights", "config_float", "config_int", "expected_shapes", "refuse_lfs_pointer"]

LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def config_int(value: Any, what: str, minimum: int = 1) -> int:
    """`value` as an int of at least `minimum`; ValueError naming `what` (file and key) for a string, a float with
    a fraction, a bool, an array or a value out of range, read from a file that may have been written by anyone."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer():
        number = int(value)  # 32.0 from a JSON writer that prints every number as a float
    else:
        raise ValueError(f"{what} is {value!r}, not an integer")
    if number < minimum:
        raise ValueError(f"{what} is {number}, expected at least {minimum}")
    if number >= 2**63:  # no count or size of a model is: JSON's 400-digit integers overflowed every float after
        raise ValueError(f"{what} is {str(number)[:40]}..., past 2**63")
    return number


def config_float(value: Any, what: str) -> float:
    """`value` as a finite positive float (RoPE's base, RMSNorm's epsilon); ValueError naming `what` otherwise (an
    integer past a float's range too: JSON reads a 400-digit number as one, and isfinite raised OverflowError)."""
    try:
        finite = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite or value <= 0:
        raise ValueError(f"{what} is {value!r:.60}, expected a finite number above 0")
    return float(value)


def check_heads(config: ModelConfig, where: str) -> None:
    """ValueError unless the query heads share the KV heads evenly and each head's dims pair up for RoPE."""
    if config.num_heads % config.num_kv_heads:
        raise ValueError(
            f"{where}: {config.num_heads} attention heads are not a multiple of {config.num_kv_heads} KV heads"
        )
    if config.head_dim % 2:
        raise ValueError(f"{where}: head_dim {config.head_dim} is odd; RoPE rotates pairs of dims")


def check_weights(config: ModelConfig, weights: Mapping[str, Any], source: str = "model") -> None:
    """Raise ValueError unless `weights` holds exactly the expected names with the expected shapes."""
    if config.num_layers > len(weights):  # each layer has 9 weights: refused before listing 10**8 layers' names
        raise ValueError(
            f"{source}: weights do not match the config: it has {config.num_layers} layers, "
            f"but there are only {len(weights)} weights in all"
        )
    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} weights, e.g. {missing[:3]}")
    if extra:
        problems.append(f"unexpected {len(extra)} weights, e.g. {extra[:3]}")
    for name, shape in expected.items():
        if name in weights and tuple(weights[name].shape) != shape:
            problems.append(f"{name} has shape {tuple(weights[name].shape)}, expected {shape}")
    if problems:
        raise ValueError(f"{source}: weights do not match the config: " + "; ".join(problems[:5]))


def refuse_lfs_pointer(path: str) -> None:
    """ValueError naming `path` when it is a Git LFS pointer (the ~130-byte text a clone without git-lfs leaves in
    place of a large file): its parser would say only that it is not a GGUF, safetensors or tokenizer file."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(LFS_POINTER))
    except OSError:
        return  # the parser's own open names the problem
    if head == LFS_POINTER:
        raise ValueError(
            f"{path}: a Git LFS pointer, not the file itself (the repository was cloned without git-lfs: run "
            "`git lfs pull` in it, or download the file)"
        )
