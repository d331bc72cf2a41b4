"""A kernel plan: which linear path (model.linear's PATHS) each of a model's weight shapes runs at each row count,
as measured on this machine (model.kernel_tune), and the JSON file that keeps it between runs.

Rows are timed at BUCKETS (every decode batch of 1 to 8, then 16, 64 and 256 rows for larger batches and prefill
chunks); a row count between two buckets takes the next one's path, and a count past the last takes the last's.

The file is per key: the CPU (model name and the flags that matter), the torch version, the thread count, the
dtype and the model's shapes (each with how many layers have it: a shape's time depends on whether its weights fit
in the cache). It lives in `$XDG_CACHE_HOME/radixcache/kernels`, else `~/.cache/radixcache/kernels`, named by a
digest of the key, and holds the key itself: a file whose key, buckets or paths are not what this run expects
(another machine's, another torch's, a damaged one) is ignored with a warning and measured again, never trusted and
never a crash. Where the folder cannot be written the plan is used for this run only (a warning says so).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixcache.runtime import atomic_file
from radixcache.runtime.model.linear import PATHS

log = logging.getLogger("radixcache.kernels")

BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 64, 256)  # row counts timed; see the module docstring
FORMAT = 1  # the file's layout; another value is a foreign file
KERNEL_MODES = ("auto", "fixed", "retune")  # EngineConfig.kernels; see model.kernel_tune


def shape_name(out_features: int, in_features: int) -> str:
    """A weight shape as the plan names it: "960x576" (out x in)."""
    return f"{out_features}x{in_features}"


def bucket_for(rows: int) -> int:
    """The bucket whose path serves `rows` rows: the smallest bucket >= rows, else the last."""
    for bucket in BUCKETS:
        if rows <= bucket:
            return bucket
    return BUCKETS[-1]


@dataclass(frozen=True)
class KernelPlan:
    """`choices[shape][bucket]` is the path for that shape at that many rows; `timings_us[shape][bucket][path]`
    what each path took (microseconds for all the layers of the shape timed together; see model.kernel_tune).
    `source`: "measured" in this run, "cache" (read back from `path`), or "fixed" (no choices: the fixed rules, for
    the reason in `note`). `key`: what the plan holds for."""

    key: dict[str, Any]
    choices: dict[str, dict[int, str]]
    timings_us: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    source: str = "measured"
    seconds: float = 0.0  # time spent measuring
    load_average: float | None = None  # the one-minute load average when it was measured
    path: str | None = None  # the file it was read from or written to
    note: str = ""

    def by_rows(self, shape: str) -> tuple[str, ...]:
        """The path for each row count from 0 to BUCKETS[-1] (index: rows; the last entry serves every larger
        count; 0 rows takes 1 row's): what DenseLinear.use_paths takes."""
        chosen = self.choices[shape]
        return tuple(chosen[bucket_for(max(rows, 1))] for rows in range(BUCKETS[-1] + 1))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "key": self.key,
            "buckets": list(BUCKETS),
            "choices": {s: {str(b): p for b, p in c.items()} for s, c in self.choices.items()},
            "timings_us": {
                s: {str(b): {p: round(us, 1) for p, us in t.items()} for b, t in by.items()}
                for s, by in self.timings_us.items()
            },
            "seconds": round(self.seconds, 3),
            "load_average": self.load_average,
        }

    @classmethod
    def from_json(cls, data: Any, key: dict[str, Any], path: str | None = None) -> KernelPlan:
        """The plan in `data` (a parsed file) if it was measured for `key`; ValueError saying what is wrong."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a kernel plan of format {FORMAT}")
        if data.get("key") != key:
            raise ValueError("measured for another machine, torch, thread count or model")
        if data.get("buckets") != list(BUCKETS):
            raise ValueError(f"its row buckets {data.get('buckets')!r} are not {list(BUCKETS)}")
        raw = data.get("choices")
        shapes = {s for s, _ in key["shapes"]}
        if not isinstance(raw, dict) or set(raw) != shapes:
            raise ValueError("its shapes are not the model's")
        choices: dict[str, dict[int, str]] = {}
        for shape, by_bucket in raw.items():
            if not isinstance(by_bucket, dict) or set(by_bucket) != {str(b) for b in BUCKETS}:
                raise ValueError(f"shape {shape} lacks a path for some row bucket")
            if any(p not in PATHS for p in by_bucket.values()):
                raise ValueError(f"shape {shape} names a path that is not one of {', '.join(PATHS)}")
            choices[shape] = {int(b): p for b, p in by_bucket.items()}
        timings = data.get("timings_us") if isinstance(data.get("timings_us"), dict) else {}
        seconds = data.get("seconds")
        load = data.get("load_average")
        return cls(
            key=key,
            choices=choices,
            timings_us=_timings(timings),
            source="cache",
            seconds=float(seconds) if _finite(seconds) else 0.0,
            load_average=float(load) if _finite(load) else None,
            path=path,
        )


def _finite(value: Any) -> bool:
    """A number a plan's display fields may hold: Python's JSON reads NaN and Infinity, which `doctor --json` would
    then write out as no JSON parser reads them. An integer past a float's range (JSON's 400-digit numbers) is not:
    isfinite raised OverflowError, which no reader of a damaged file catches, and the engine failed to start."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _timings(raw: dict[str, Any]) -> dict[str, dict[int, dict[str, float]]]:
    """The timings of a file, for display only: whatever does not parse is left out."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for shape, by in raw.items():
        if not isinstance(by, dict):
            continue
        for bucket, times in by.items():
            if str(bucket).isdigit() and isinstance(times, dict):
                clean = {p: float(us) for p, us in times.items() if p in PATHS and _finite(us)}
                out.setdefault(shape, {})[int(bucket)] = clean
    return out


def plan_key(
    shapes: dict[str, int],
    threads: int,
    dtype: str,
    cpu: str,
    flags: tuple[str, ...],
    torch_version: str,
    native: str = "",
    rule: str = "",
) -> dict[str, Any]:
    """What a plan holds for: `shapes` maps each shape name to how many layers have it. The paths it chose from
    are part of it, `native`, the native kernels' source digest (empty where they do not run), and `rule`, how
    the timings became choices: a plan measured before a path existed, with other native kernels (or none) or chosen
    by another rule is measured again."""
    return {
        "paths": list(PATHS),
        "native": native,
        "rule": rule,
        "cpu": cpu,
        "flags": list(flags),
        "torch": torch_version,
        "threads": threads,
        "dtype": dtype,
        "shapes": [[s, n] for s, n in sorted(shapes.items())],
    }


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/radixcache/kernels` (an absolute XDG_CACHE_HOME only, as the XDG spec says), else
    `~/.cache/radixcache/kernels`. OSError where neither names a folder (HOME unset and the user has no passwd
    entry, as in a container run under an arbitrary uid): a folder that cannot be written, for the callers."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "radixcache" / "kernels"
    try:
        home = Path.home()
    except RuntimeError as exc:  # pathlib's "Could not determine home directory."
        raise OSError(f"no home folder ({exc}); set XDG_CACHE_HOME") from exc
    return home / ".cache" / "radixcache" / "kernels"


def plan_file(key: dict[str, Any]) -> Path:
    digest = hashlib.blake2b(json.dumps(key, sort_keys=True).encode(), digest_size=12).hexdigest()
    return cache_dir() / f"plan-{digest}.json"


def read_plan(key: dict[str, Any]) -> KernelPlan | None:
    """The cached plan for `key`, or None: none yet, or one that is unreadable or foreign (a warning says which
    file and why)."""
    try:
        path = plan_file(key)
    except OSError:  # no folder, so no file: measured and, where it cannot be written, said so then
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("kernel plan %s cannot be read (%s): measuring again", path, exc)
        return None
    try:
        return KernelPlan.from_json(json.loads(text), key, str(path))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:  # RecursionError: deep nesting
        log.warning("kernel plan %s is ignored (%s): measuring again", path, exc)
        return None


def write_plan(plan: KernelPlan) -> str | None:
    """Write `plan` to its file, whole (radixcache.runtime.atomic_file: synced, then renamed onto it, so a reader or
    a start after a crash sees the old file or the new one); the path, or None where the folder cannot be written (a
    warning says so and the plan serves this run only)."""
    try:
        path = plan_file(plan.key)
    except OSError as exc:  # no folder to write in
        log.warning("kernel plan not cached (%s); it serves this run only", exc)
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_file.write_bytes(path, json.dumps(plan.to_json(), indent=1, sort_keys=True).encode("utf-8"))
    except OSError as exc:
        reason = exc.strerror or exc
        log.warning("kernel plan not cached (%s cannot be written: %s); it serves this run only", path, reason)
        return None
    return str(path)
