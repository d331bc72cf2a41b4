"""Argument types the scripts share, checked as argparse parses them, so a bad value is a usage error naming its
option before a model loads or a run starts: a count of 0 was a traceback from inside the run (an empty max(), a
division by zero), and a negative size ran on."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def at_least(least: int) -> Callable[[str], int]:
    """An int >= `least`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"expected an int >= {least}, got {text!r}")
        return value

    return parse


def number(low: float, high: float, *, above_low: bool = False) -> Callable[[str], float]:
    """A finite number in [low, high], or (low, high] with `above_low`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > low if above_low else value >= low) and value <= high):
            shown = f"({low}, {high}]" if above_low else f"[{low}, {high}]"
            raise argparse.ArgumentTypeError(f"expected a finite number in {shown}, got {text!r}")
        return value

    return parse


def replica_counts(ctx: object, param: object, text: str) -> list[int]:
    """A click callback: comma-separated replica counts, each in [1, MAX_SIM_REPLICAS], as a usage error naming the
    option before any replay (0 or "abc" was a traceback, after the cells of the counts before it)."""
    import click

    from radixcache.sim.routing_replay import MAX_SIM_REPLICAS

    try:
        counts = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        counts = []
    if not counts or not all(1 <= n <= MAX_SIM_REPLICAS for n in counts):
        raise click.BadParameter(f"expected replica counts in [1, {MAX_SIM_REPLICAS:,}] like 2,16, got {text!r}")
    return counts


def positive_numbers(ctx: object, param: object, text: str | float) -> list[float]:
    """A click callback: comma-separated finite numbers > 0 (or one number), as a usage error naming the option before
    any replay (0 or nan was a RadixCacheError traceback from inside the first replay)."""
    import click

    try:
        values = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise click.BadParameter(f"expected finite numbers > 0, got {text!r}")
    return values
