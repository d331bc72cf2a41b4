"""What the engine's option groups (cli.engine_options, cli.tier_options) share: options stacked in --help order,
and the check that a size option parses as a memory budget, before the model loads."""

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
