"""The tier options of replay, chat and serve (cli.engine_options stacks them with the others): a host tier and a
disk tier under the KV pool, the host tier's write policy and the disk tier's prefetch (docs/tiers.md).

`tier_options` adds the options; `tier_kwargs` turns their values into EngineConfig's keyword arguments, refusing a
bad size, a NaN timeout, a --cache-dir that is not a directory, or a tier's option given without its tier (which
the engine would ignore), before the model loads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from radixcache.cli.option_parts import DEFAULT, check_sizes, stacked


def _directory_or_new(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--cache-dir: a directory or a path not there yet. click.Path(file_okay=False) refuses only a regular file: a
    device or a pipe (/dev/null) got through, and the run went on with its disk tier off behind one warning line."""
    import os

    if value is not None and os.path.exists(value) and not os.path.isdir(value):
        raise click.BadParameter(f"'{value}' exists and is not a directory")
    return value


def tier_options(func: Callable) -> Callable:
    """--host-kv-memory, --cache-dir, --cache-dir-size, --write-policy, --prefetch-policy, --prefetch-timeout-ms,
    --prefetch-pages-per-step: the tiers under the KV pool."""
    from radixcache.runtime.kv.tier.prefetch_policy import (
        DEFAULT_PAGES_PER_STEP,
        DEFAULT_PREFETCH_POLICY,
        DEFAULT_PREFETCH_TIMEOUT_MS,
        PREFETCH_POLICIES,
    )
    from radixcache.tier.tiered_cache import WRITE_POLICIES

    options = [
        click.option(
            "--host-kv-memory",
            help="A host tier of this size under the KV pool, e.g. 2GiB: pages the pool drops wait there and are "
            "copied back when that is cheaper than recomputing them. Disk reads (--cache-dir) are staged in memory "
            "of their own, at most the KV pool's size and 512MiB, whatever this size.",
        ),
        click.option(
            "--cache-dir",
            type=click.Path(file_okay=False),
            callback=_directory_or_new,
            help="Persist KV pages in this directory (a disk tier): a restarted process hits what it served before.",
        ),
        click.option(
            "--cache-dir-size", default="8GiB", show_default=True, help="The disk tier's size limit (LRU beyond it)."
        ),
        click.option(
            "--write-policy",
            default="write_through",
            show_default=True,
            type=click.Choice(WRITE_POLICIES),
            help="When the host tier gets a copy of a page: as the tree adopts it, once it is hit twice, or when the "
            "pool evicts it.",
        ),
        click.option(
            "--prefetch-policy",
            default=DEFAULT_PREFETCH_POLICY,
            show_default=True,
            type=click.Choice(PREFETCH_POLICIES),
            help="When a request whose prefix is on disk is admitted while its pages are read off the loop: at once "
            "with what has arrived, once every page is read, or once read or --prefetch-timeout-ms has passed.",
        ),
        click.option(
            "--prefetch-timeout-ms",
            default=DEFAULT_PREFETCH_TIMEOUT_MS,
            show_default=True,
            type=click.FloatRange(min=0, max=1e9),
            help="With --prefetch-policy timeout: the longest a request waits for its disk pages before it is admitted "
            "and recomputes the rest.",
        ),
        click.option(
            "--prefetch-pages-per-step",
            default=DEFAULT_PAGES_PER_STEP,
            show_default=True,
            type=click.IntRange(min=0, max=1 << 20),
            help="While requests decode, the disk page reads the prefetch readers may start per step (more when a "
            "timeout needs them); 0 reads without a pace.",
        ),
    ]
    return stacked(func, options)


#: a tier's options (parameter names) -> the tier, and the option that adds it (docs/tiers.md: the write policy is the
#: host tier's; the disk tier is always written through, and read ahead by the prefetch)
_TIER_NEEDS = {
    "write_policy": ("host", "--host-kv-memory"),
    "cache_dir_size": ("disk", "--cache-dir"),
    "prefetch_policy": ("disk", "--cache-dir"),
    "prefetch_timeout_ms": ("disk", "--cache-dir"),
    "prefetch_pages_per_step": ("disk", "--cache-dir"),
}


def tier_kwargs(
    host_kv_memory: str | None,
    cache_dir: str | None,
    cache_dir_size: str,
    write_policy: str,
    prefetch_policy: str,
    prefetch_timeout_ms: float,
    prefetch_pages_per_step: int,
) -> dict[str, Any]:
    """Engine arguments from the tier options; a bad size, or a tier's option given without the tier (which the
    engine would ignore), is refused before the model loads."""
    check_sizes({"--host-kv-memory": host_kv_memory, "--cache-dir-size": cache_dir_size})
    if prefetch_timeout_ms != prefetch_timeout_ms:  # NaN: FloatRange lets it through, the engine refused it loaded
        raise click.BadParameter("nan is not a number of milliseconds", param_hint="'--prefetch-timeout-ms'")
    ctx = click.get_current_context(silent=True)
    given = {name for name in _TIER_NEEDS if ctx is not None and ctx.get_parameter_source(name) not in (None, DEFAULT)}
    for name in sorted(given):
        tier, needs = _TIER_NEEDS[name]
        if {"host": host_kv_memory, "disk": cache_dir}[tier] is None:
            raise click.UsageError(f"--{name.replace('_', '-')} is for the {tier} tier: add {needs}")
    return {
        "host_kv_memory": host_kv_memory,
        "cache_dir": cache_dir,
        "cache_dir_size": cache_dir_size,
        "write_policy": write_policy,
        "prefetch_policy": prefetch_policy,
        "prefetch_timeout_ms": prefetch_timeout_ms,
        "prefetch_pages_per_step": prefetch_pages_per_step,
    }
