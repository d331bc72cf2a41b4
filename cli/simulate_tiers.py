"""`radixcache simulate`'s tier options (--host-capacity-blocks, --disk-capacity-blocks, --write-policy and the
cost flags) as one TierConfig, or a usage error for flags that need a tier."""

from __future__ import annotations

import math

import click

from radixcache.errors import RadixCacheError
from radixcache.sim.tiers import DEFAULT_TIER_COSTS, TierConfig, TierCosts


def tier_config(
    host: int | None,
    disk: int | None,
    write_policy: str | None,
    prefill: float | None,
    host_load: float | None,
    disk_load: float | None,
) -> TierConfig | None:
    """The tiers the flags ask for (None: the device cache alone), or a usage error for flags that need a tier."""
    costs = {
        "--prefill-ms-per-token": prefill,
        "--host-load-ms-per-page": host_load,
        "--disk-load-ms-per-page": disk_load,
    }
    if host is None and disk is None:
        given = [name for name, value in costs.items() if value is not None]
        if write_policy is not None:
            given.insert(0, "--write-policy")
        if given:
            raise click.UsageError(
                f"{', '.join(given)}: only for tiers or replicas; add --host-capacity-blocks and/or "
                "--disk-capacity-blocks, or --replicas"
            )
        return None
    for flag, value in costs.items():
        if value is not None and not math.isfinite(value):
            raise click.UsageError(f"{flag} must be a finite number of milliseconds, got {value}")
    if write_policy is not None and host is None:
        raise click.UsageError("--write-policy decides when the host tier gets a copy: add --host-capacity-blocks")
    d = DEFAULT_TIER_COSTS
    try:
        model = TierCosts(
            d.prefill_ms_per_token if prefill is None else prefill,
            d.host_load_ms_per_page if host_load is None else host_load,
            d.disk_load_ms_per_page if disk_load is None else disk_load,
        )
    except RadixCacheError as exc:
        raise click.UsageError(str(exc)) from None
    return TierConfig(host, disk, write_policy or "write_through", model)
