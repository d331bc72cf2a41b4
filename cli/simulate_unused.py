"""The `simulate` options a run would not use, refused by name: each mode (one cache, `--policies`, `--replicas`)
reads its own. (`--leases` keeps its own list, cli/simulate_leases.py.)"""

from __future__ import annotations

import click
from click.core import ParameterSource

#: mode -> option (its parameter's name) -> why the mode ignores it
_IGNORED: dict[str, dict[str, str]] = {
    "without --replicas": {"seed": "it seeds --rate and power_of_two, with --replicas"},
    "with --policies": {
        "policy": "--policies names the policies",
        "windows": "the table has no windows",
        "prefill_chunk": "the engine's commits are modelled for one --policy",
    },
    "with --replicas": {
        "windows": "a routed replay has no windows",
        "no_infinite": "a routed replay has no bound",
        "prefill_chunk": "a routed replica commits its prompt when its prefill ends",
        "read_ahead": "a routed replay reads its trace in this process",
    },
    "with --in-memory": {"read_ahead": "the trace is read whole first, in this process"},
}
#: the options whose flag has a `--no-` form too, named with both
_FLAGS = {"read_ahead": "--read-ahead/--no-read-ahead"}


def refuse_ignored(replicas: int | None, policies: str | None, in_memory: bool = False) -> None:
    """A usage error naming the options given on the command line that this run's mode would ignore (--leases, which
    alone reads --lease-budget, has its own: cli/simulate_leases.py)."""
    mode = "with --replicas" if replicas is not None else "with --policies" if policies is not None else None
    ctx = click.get_current_context()
    if ctx.get_parameter_source("lease_budget") not in (ParameterSource.DEFAULT, None):  # even at its default 0.5
        raise click.UsageError("--lease-budget is for --leases")
    modes = [mode or "without --replicas"] + (["with --in-memory"] if in_memory else [])
    for mode in modes:
        for name, why in _IGNORED[mode].items():
            if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
                flag = _FLAGS.get(name, f"--{name.replace('_', '-')}")
                raise click.UsageError(f"{flag}: not used {mode} ({why})")
