"""The trace a `simulate` run replays and the cache's size: one value that every mode of the command reads first
(one cache, `--leases`, `--replicas`), instead of six arguments passed along to each."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import click
from click.core import ParameterSource

from radixcache.trace import FORMAT_KINDS, detect_format


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
    name: str = ""  # how output names the trace: `<stdin>` for a piped one (cli/piped_trace.py), else `trace`

    @property
    def shown(self) -> str:
        return self.name or self.trace

    def blocks(self, workload: _Sized) -> int:
        """The capacity in blocks of `workload` (--capacity-tokens over its block size); a usage error below one."""
        blocks = self.capacity_blocks or workload.blocks_for_tokens(self.capacity_tokens or 0)
        if blocks < 1:
            raise click.UsageError(f"--capacity-tokens {self.capacity_tokens} is less than one block")
        return blocks


def trace_capacity(
    trace: str,
    fmt: str | None,
    page_size: int | None,
    block_size: int,
    capacity_blocks: int | None,
    capacity_tokens: int | None,
    name: str = "",
) -> TraceCapacity:
    """The options as one TraceCapacity, or a usage error: not exactly one of the two sizes, or --block-size given
    for a token trace, whose pages are --page-size (ignored, it left the pages at one token: a cache of
    --capacity-blocks tokens)."""
    if (capacity_blocks is None) == (capacity_tokens is None):
        raise click.UsageError("give exactly one of --capacity-blocks and --capacity-tokens")
    if os.path.exists(trace) and not os.path.isfile(trace):
        # A pipe (/dev/stdin, <(zcat ...)) is read once: the replay's later passes (the format, its bounds, the
        # read-ahead) found it empty, and reported 0 requests at a hit rate of 0% without a word. The command copies
        # a pipe into a file first (cli/piped_trace.py): this is for a caller that did not.
        message = f"{trace} is not a regular file (a pipe?): the simulator reads it more than once; save it to a file"
        raise click.BadParameter(message, param_hint="'TRACE'")
    explicit = click.get_current_context().get_parameter_source("block_size") is not ParameterSource.DEFAULT
    if explicit and FORMAT_KINDS[fmt or detect_format(trace)] == "token":
        raise click.UsageError(
            f"--block-size is for hash-block traces: give a token trace's page as --page-size {block_size}"
        )
    return TraceCapacity(trace, fmt, page_size, block_size, capacity_blocks, capacity_tokens, name)
