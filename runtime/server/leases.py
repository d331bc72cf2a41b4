"""Leases on the server: the per-tenant default `retain_for` and what the response says was granted.

A request's lease (runtime.kv.leases) comes from its body's `retain_for` (an OpenAI `extra_body` field), else from
the server's default for its API key: `create_app(..., lease_defaults={"sk-alice": 60, "*": 10})`, or
`radixcache serve --retain-for sk-alice=60 --retain-for 10`, where "*" (a bare SECONDS on the command line) is the
default of every caller whose key is not named, keyless callers included. Without one, no lease.

The response says what was granted, in `usage.lease`: `{"seconds": s, "tokens": t}` (the most any choice of the
request got; both 0 when nothing was held), present only when a lease was asked for (by the body or a default).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from radixcache.runtime.engine.request import GenerationResult
from radixcache.runtime.kv.leases import check_retain_for

EVERY_KEY = "*"


def check_lease_defaults(defaults: Mapping[str, float] | None) -> dict[str, float]:
    """The per-key defaults, checked (ValueError naming the key whose value is bad)."""
    out: dict[str, float] = {}
    for key, seconds in (defaults or {}).items():
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"lease_defaults: a key must be a non-empty string, got {key!r}")
        value = check_retain_for(seconds, f"lease_defaults[{key!r}]")
        if value:
            out[key] = value
    return out


def parse_lease_defaults(specs: Iterable[str]) -> dict[str, float]:
    """`--retain-for` values: "SECONDS" (every caller) or "KEY=SECONDS" (one API key), to lease_defaults."""
    out: dict[str, Any] = {}
    for spec in specs:
        key, sep, seconds = spec.rpartition("=")
        key = key if sep else EVERY_KEY
        try:
            out[key] = float(seconds)
        except ValueError:
            raise ValueError(f"--retain-for takes SECONDS or KEY=SECONDS, got {spec!r}") from None
    return check_lease_defaults(out)


def retain_for(asked: float | None, key: str | None, defaults: Mapping[str, float]) -> float | None:
    """A request's lease seconds: its body's, else its key's default, else the default of every key (None: none)."""
    if asked is not None:
        return asked
    if key is not None and key in defaults:
        return defaults[key]
    return defaults.get(EVERY_KEY)


def lease_usage(results: Sequence[GenerationResult], asked: bool = False) -> dict[str, Any] | None:
    """`usage.lease` for a request's results, None when none asked for a lease. `asked`: the request asked for one
    (an empty completion, max_tokens 0, has no results: it held nothing)."""
    leases = [r.lease for r in results if r.lease is not None]
    if not leases:
        return {"seconds": 0.0, "tokens": 0} if asked else None
    return {"seconds": max(g.seconds for g in leases), "tokens": max(g.tokens for g in leases)}
