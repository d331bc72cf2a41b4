"""What the engine's option groups (cli.engine_options, cli.tier_options) share: options stacked in --help order,
and the checks before the model loads that a size option parses as a memory budget and a --device is one torch has."""

from __future__ import annotations

from collections.abc import Callable

import click
from click.core import ParameterSource

DEFAULT = ParameterSource.DEFAULT


def stacked(func: Callable, options: list[Callable]) -> Callable:
    """`func` with `options` applied so that they appear in --help in the order listed."""
    for option in reversed(options):
        func = option(func)
    return func


def check_sizes(sizes: dict[str, str | None]) -> None:
    """Each given size (by its option's name) parses as a memory budget; else a bad-option error naming it."""
    from radixcache.runtime.kv.pool import parse_memory

    for option, value in sizes.items():
        if value is None:
            continue
        try:
            parse_memory(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=f"'{option}'") from None


def check_device(device: str) -> None:
    """Refuse, before the model loads, a --device torch cannot parse or has no such device of (torch's errors were
    internal errors, after the load)."""
    import torch

    hint = "'--device'"
    try:
        where = torch.device(device)
    except (RuntimeError, ValueError):
        message = f"{device!r} is not a torch device (e.g. cpu, cuda, cuda:1)"
        raise click.BadParameter(message, param_hint=hint) from None
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}.get(where.type)
    if available is not None and not available():
        raise click.BadParameter(f"{device!r}: this torch has no {where.type} device", param_hint=hint)
    if where.type == "cuda" and where.index is not None and where.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise click.BadParameter(f"{device!r}: this machine has {count} CUDA devices", param_hint=hint)
