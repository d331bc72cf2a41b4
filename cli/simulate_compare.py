"""`radixcache simulate --policies`: every named policy, both Belady bounds and the infinite cache in one table."""

from __future__ import annotations

from collections.abc import Sequence

import click

from radixcache.cli.simulate_tables import print_comparison, print_json
from radixcache.sim.compare import compare
from radixcache.sim.replay_common import Replayable


def compare_policies(
    trace: str,
    workload: Replayable,
    blocks: int,
    names: Sequence[str],
    admission: str | None,
    concurrency: int,
    infinite: bool,
    as_json: bool,
    honor_timestamps: bool = False,
) -> None:
    """`--policies`: every named policy, both Belady bounds and the infinite cache, in one table or JSON."""
    if admission == "reuse" and "reuse" not in names:
        raise click.UsageError("--admission reuse learns from the reuse eviction policy: include reuse in --policies")
    rows = compare(
        workload,
        blocks,
        names,
        concurrency=concurrency,
        admission=admission,
        infinite=infinite,
        honor_timestamps=honor_timestamps,
    )
    if as_json:
        out = {"capacity_blocks": blocks, "concurrency": concurrency, "runs": [row.as_dict() for row in rows]}
        print_json(out)
        return
    print_comparison(trace, rows, blocks, concurrency)
