"""Where a prefill chunk's cached prefix lies in the pool, so that the chunk reads it in place (the CPU path).

A chunk's queries see every position of its cached prefix (no mask), and softmax attention does not depend on the
order of the keys: the prefix may be read as any number of pieces, each one flash-attention call, merged by their
log-sum-exp (`attention.split_prefill_attention`). `plan_prefix` cuts the prefix's full pages into runs of
consecutive block ids (in any order, as decode's `attention.page_runs` does): the longest runs, up to
`MAX_PREFIX_RUNS` of at least `MIN_RUN_PAGES` pages, are views of the pool (no copy); the pages left over and the
partial last page (whose slots past the prefix hold the chunk's own new keys, which it reads causally elsewhere) are
gathered into one small tensor. A prefix whose blocks were handed out in order (the usual case) is one view.

Before this, every chunk gathered its whole prefix for every layer: a 64-token question after a 4,000-token
prefix copied 4,000 positions' K and V 30 times (SmolLM2), about 10% of its forward pass on this CPU.

The plan is built once per forward from the host's block table; `prefix_pieces` makes one layer's views from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MAX_PREFIX_RUNS = 8  # views read in place per chunk; the shorter runs beyond them are gathered
MIN_RUN_PAGES = 2  # a run shorter than this is gathered with the rest (one call less, a page copied)


@dataclass(frozen=True, slots=True)
class PrefixPlan:
    """A cached prefix of `length` positions: `runs` of full pages read in place as `(first block id, blocks)`,
    and `gathered` block ids copied into one tensor (full pages first, the partial last page, if any, last), of
    which the first `gathered_tokens` positions belong to the prefix."""

    length: int
    runs: tuple[tuple[int, int], ...]
    gathered: tuple[int, ...]
    gathered_tokens: int

    @property
    def in_place_tokens(self) -> int:
        return self.length - self.gathered_tokens


def plan_prefix(table: Sequence[int], length: int, page_size: int) -> PrefixPlan:
    """The pieces of positions `0 .. length - 1` of a sequence whose pages are `table` (see the module docstring)."""
    if length < 0 or page_size < 1:
        raise ValueError(f"a prefix of {length} positions at page_size {page_size}")
    full, rest = divmod(length, page_size)
    if len(table) < full + (1 if rest else 0):
        raise ValueError(f"block table of {len(table)} pages cannot hold {length} positions at page_size {page_size}")
    runs: list[tuple[int, int]] = []
    for block in sorted(int(b) for b in table[:full]):
        if runs and runs[-1][0] + runs[-1][1] == block:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((block, 1))
    longest = sorted((r for r in runs if r[1] >= MIN_RUN_PAGES), key=lambda r: -r[1])[:MAX_PREFIX_RUNS]
    kept = set(longest)
    gathered = [first + i for first, count in runs if (first, count) not in kept for i in range(count)]
    gathered_tokens = len(gathered) * page_size + rest
    if rest:
        gathered.append(int(table[full]))
    return PrefixPlan(length, tuple(sorted(longest)), tuple(gathered), gathered_tokens)


def prefix_pieces(
    plan: PrefixPlan, k_pages: torch.Tensor, v_pages: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One layer's prefix as `(k, v)` pieces, each `[S_i, kv_heads, head_dim]`: views of `k_pages`/`v_pages`
    (`[blocks, page_size, kv_heads, head_dim]`) for the runs, one gathered copy for the rest (when there is any)."""
    _, p, kvh, d = k_pages.shape
    pieces = [
        (k_pages[first : first + count].view(count * p, kvh, d), v_pages[first : first + count].view(count * p, kvh, d))
        for first, count in plan.runs
    ]
    if plan.gathered_tokens:
        index = torch.tensor(plan.gathered, dtype=torch.int64, device=k_pages.device)
        n = plan.gathered_tokens
        k = k_pages.index_select(0, index).view(len(plan.gathered) * p, kvh, d)[:n]
        v = v_pages.index_select(0, index).view(len(plan.gathered) * p, kvh, d)[:n]
        pieces.append((k, v))
    return pieces
