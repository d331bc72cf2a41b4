"""Applying grammar masks to a batch of logits rows in one call (torch; CPU or CUDA).

`fill_masks` computes the mask rows of several requests (those with no grammar get none); `apply_masks` sets the
disallowed logits of those rows to -inf with one unpack and one `masked_fill_`, so an unconstrained request in the
same batch is untouched and the batch is never waited on row by row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from radixcache.runtime.grammar.state import GrammarState, allocate_masks

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def fill_masks(states: Sequence[GrammarState | None], vocab_size: int) -> tuple[np.ndarray, list[int]]:
    """The mask rows of the requests that have a grammar, and their row indices in the batch."""
    rows = [i for i, s in enumerate(states) if s is not None]
    masks = allocate_masks(len(rows), vocab_size)
    for j, i in enumerate(rows):
        states[i].allowed_mask(masks[j])  # type: ignore[union-attr]
    return masks, rows


def unpack_masks(masks: np.ndarray | torch.Tensor, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(n, words) int32 bit rows -> (n, vocab_size) bool, True where the token is allowed."""
    device = torch.device(device)
    words = torch.as_tensor(masks, dtype=torch.int32).to(device, non_blocking=True)
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    bits = (words.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab_size].bool()


def apply_masks(logits: torch.Tensor, masks: np.ndarray | torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """Set `logits[rows[j], t] = -inf` for every token `t` that mask row `j` disallows, in place; columns past the
    masks' width are disallowed too. Returns `logits`."""
    if not len(rows):
        return logits
    vocab = logits.shape[-1]
    allowed = unpack_masks(masks, vocab, logits.device)
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    index = torch.as_tensor(list(rows), dtype=torch.long, device=logits.device)
    sub = logits.index_select(0, index).masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, index, sub)
    return logits
