"""The trace a `simulate` run replays and the cache's size: one value that every mode of the command reads first
(one cache, `--leases`, `--replicas`), instead of six arguments passed along to each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import click


class _Sized(Protocol):
    def blocks_for_tokens(self, tokens: int) -> int: ...


@dataclass(frozen=True, slots=True)
class TraceCapacity:
    """TRACE with its --format, --page-size and --block-size, and the cache's --capacity-blocks or --capacity-tokens
    (exactly one of the two: the command checks it)."""

    trace: str
    fmt: str | None
    page_size: int | None
    block_size: int
    capacity_blocks: int | None
    capacity_tokens: int | None

    def blocks(self, workload: _Sized) -> int:
        """The capacity in blocks of `workload` (--capacity-tokens over its block size); a usage error below one."""
        blocks = self.capacity_blocks or workload.blocks_for_tokens(self.capacity_tokens or 0)
        if blocks < 1:
            raise click.UsageError(f"--capacity-tokens {self.capacity_tokens} is less than one block")
        return blocks
