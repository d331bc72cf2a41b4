"""Applying grammar masks to a batch of logits rows in one call (torch; CPU or CUDA).

`fill_masks` computes the mask rows of several requests (those with no grammar get none), in parallel threads
outside the GIL when given an executor; `apply_masks` sets the
disallowed logits of those rows to -inf with one unpack and one `masked_fill_`, so an unconstrained request in the
same batch is untouched and the batch is never waited on row by row.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import numpy as np
import torch

from radixcache.runtime.grammar.state import GrammarState, allocate_masks

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def fill_masks(
    states: Sequence[GrammarState | None], vocab_size: int, executor: llguidance.LLExecutor | None = None
) -> tuple[np.ndarray, list[int]]:
    """The mask rows of the requests that have a grammar, and their row indices in the batch. With an `executor`
    (`make_executor()`), the matchers' rows are computed in parallel threads outside the GIL."""
    rows = [i for i, s in enumerate(states) if s is not None]
    masks = allocate_masks(len(rows), vocab_size)
    todo = [(j, states[i]) for j, i in enumerate(rows) if not states[i].fill_without_matcher(masks[j])]  # type: ignore[union-attr]
    if executor is not None and len(todo) > 1:
        executor.unsafe_compute_mask_ptr(
            [(s.matcher, j) for j, s in todo], masks.ctypes.data, masks.shape[1] * 4, masks.shape[0]
        )
    else:
        for j, s in todo:
            s.matcher.unsafe_compute_mask_ptr(masks[j].ctypes.data, masks[j].nbytes)
    for j, s in todo:
        s.finish_mask(masks[j])
    return masks, rows


def make_executor(threads: int | None = None) -> llguidance.LLExecutor:
    """A thread pool for `fill_masks` (default: llguidance's, 80% of the CPUs up to 32)."""
    return llguidance.LLExecutor(threads)


def unpack_masks(masks: np.ndarray | torch.Tensor, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(n, words) int32 bit rows -> (n, vocab_size) bool, True where the token is allowed. On the CPU numpy unpacks
    the bits; on a GPU the packed rows (1/32 of the size) are copied and unpacked there."""
    device = torch.device(device)
    if device.type == "cpu" and isinstance(masks, np.ndarray):
        rows = np.ascontiguousarray(masks, dtype=np.int32)
        bits = np.unpackbits(rows.view(np.uint8), axis=1, count=vocab_size, bitorder="little")
        return torch.from_numpy(bits.view(np.bool_))
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
    width = min(vocab, masks.shape[1] * 32)
    allowed = unpack_masks(masks, width, logits.device)
    if width < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - width), value=False)
    if list(rows) == list(range(logits.shape[0])):  # every row constrained: in place, no gather
        return logits.masked_fill_(~allowed, float("-inf"))
    index = torch.as_tensor(list(rows), dtype=torch.long, device=logits.device)
    sub = logits.index_select(0, index).masked_fill_(~allowed, float("-inf"))
    logits.index_copy_(0, index, sub)
    return logits
