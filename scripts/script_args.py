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
