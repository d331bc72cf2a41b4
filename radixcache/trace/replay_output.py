"""Reading back the JSON that `radixcache replay --json` writes: `{"summary": {...}, "requests": [...]}`.

Pure Python, so `radixcache trace stats` and scripts/plot_replay.py read it without torch. A `--compare` file
holds the cached run at the top level and the other run under "no_cache".
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

from radixcache.stats import percentile
from radixcache.trace.errors import TraceError
from radixcache.trace.jsonl import BOM

_PEEK = 1 << 16

#: fields every request record must carry, and their types
REQUEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "conversation": str,
    "turn": int,
    "prompt_tokens": int,
    "cached_tokens": int,
    "prefill_tokens": int,
    "output_tokens": int,
    "ttft_s": (int, float),
    "latency_s": (int, float),
}
#: summary fields `replay_stats` reads, when present, and their types
SUMMARY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "label": str,
    "model": str,
    "mode": str,
    "wall_s": (int, float),
    "skipped_too_long": int,
    "skipped_kv_full": int,
}


class ReplayLog(NamedTuple):
    """One run: its summary as written, and its request records in finishing order."""

    path: str
    summary: dict[str, Any]
    requests: list[dict[str, Any]]
    no_cache: ReplayLog | None = None


def is_replay_json(path: str | Path) -> bool:
    """Whether `path` looks like replay output: one JSON object spread over lines (never a JSONL trace), or a
    one-line object with "summary" and "requests". Only the first _PEEK bytes are read: a longer first line is a
    replay's when it starts with its summary (a trace's 300 MB line was read, decoded and parsed whole here)."""
    try:
        with open(path, "rb") as handle:
            head = handle.readline(_PEEK)
    except OSError:
        return False
    text = head.removeprefix(BOM).decode("utf-8", errors="replace")
    if len(head) == _PEEK and not head.endswith(b"\n"):
        return text.lstrip().startswith('{"summary"')
    return starts_replay_json(text)


def starts_replay_json(first_line: str) -> bool:
    """Whether a file whose first line is `first_line` looks like replay output (see `is_replay_json`)."""
    first = first_line.strip()
    if first == "{":
        return True
    if not first.startswith("{"):
        return False
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and "summary" in record and "requests" in record


def read_replay_json(path: str | Path, raw: bytes | None = None) -> ReplayLog:
    """The runs of a replay JSON file. TraceError (file, field) when it is not one. `raw`: the file's bytes, when
    they were read already (a pipe can be read only once)."""
    name = str(path)
    try:
        raw = Path(path).read_bytes() if raw is None else raw
        data = json.loads(raw.decode("utf-8"))
    except OSError as exc:
        raise TraceError(name, "open", exc.strerror or str(exc)) from None
    except UnicodeDecodeError as exc:
        line = str(raw.count(b"\n", 0, exc.start) + 1)
        raise TraceError(name, line, f"not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise TraceError(name, str(exc.lineno), f"invalid JSON ({exc.msg})") from None
    return _log(name, data, "")


def _log(name: str, data: Any, prefix: str) -> ReplayLog:
    if not isinstance(data, dict):
        raise TraceError(name, "1", f"expected a JSON object, got {type(data).__name__}", prefix.rstrip(".") or None)
    summary, requests = data.get("summary"), data.get("requests")
    if not isinstance(summary, dict):
        raise TraceError(name, "replay", "missing or not an object", f"{prefix}summary")
    if not isinstance(requests, list):
        raise TraceError(name, "replay", "missing or not a list", f"{prefix}requests")
    for field, kind in SUMMARY_FIELDS.items():
        if field in summary:
            _check(name, summary[field], kind, f"{prefix}summary.{field}")
    for index, record in enumerate(requests):
        if not isinstance(record, dict):
            raise TraceError(name, "replay", "expected an object", f"{prefix}requests[{index}]")
        for field, kind in REQUEST_FIELDS.items():
            _check(name, record.get(field), kind, f"{prefix}requests[{index}].{field}")
    other = data.get("no_cache")
    return ReplayLog(name, summary, requests, _log(name, other, "no_cache.") if other is not None else None)


def _check(name: str, value: Any, kind: type | tuple[type, ...], field: str) -> None:
    """TraceError unless `value` is of `kind`; a number must also be finite and >= 0 (json reads NaN and Infinity,
    which would make every statistic NaN and the --json output invalid)."""
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TraceError(name, "replay", f"expected {_kind(kind)}, got {value!r}", field)
    if kind is not str and not 0 <= value < math.inf:
        raise TraceError(name, "replay", f"expected a finite number >= 0, got {value!r}", field)


def _kind(kind: type | tuple[type, ...]) -> str:
    return "a number" if isinstance(kind, tuple) else {str: "a string", int: "an integer"}[kind]


def replay_stats(log: ReplayLog) -> dict[str, Any]:
    """Statistics recomputed from the request records (not copied from the summary), plus TTFT split by
    whether at least half of the prompt came from the cache."""
    reqs = log.requests
    prompt = sum(r["prompt_tokens"] for r in reqs)
    cached = sum(r["cached_tokens"] for r in reqs)
    ttft = [r["ttft_s"] for r in reqs]
    mostly = [r["ttft_s"] for r in reqs if r["prompt_tokens"] and r["cached_tokens"] * 2 >= r["prompt_tokens"]]
    rest = [r["ttft_s"] for r in reqs if not (r["prompt_tokens"] and r["cached_tokens"] * 2 >= r["prompt_tokens"])]
    decode_tokens = sum(max(0, r["output_tokens"] - 1) for r in reqs)
    decode_time = sum(max(0.0, r["latency_s"] - r["ttft_s"]) for r in reqs)
    return {
        "format": "replay-json",
        "run": log.summary.get("label", ""),
        "model": log.summary.get("model", ""),
        "mode": log.summary.get("mode", ""),
        "requests": len(reqs),
        "conversations": len({r["conversation"] for r in reqs}),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefill_tokens": sum(r["prefill_tokens"] for r in reqs),
        "output_tokens": sum(r["output_tokens"] for r in reqs),
        "hit_rate": cached / prompt if prompt else 0.0,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p90_s": percentile(ttft, 90),
        "ttft_p99_s": percentile(ttft, 99),
        "ttft_mean_mostly_cached_s": sum(mostly) / len(mostly) if mostly else 0.0,
        "ttft_mean_mostly_prefilled_s": sum(rest) / len(rest) if rest else 0.0,
        "decode_tps": decode_tokens / decode_time if decode_time > 0 else 0.0,
        "wall_s": log.summary.get("wall_s", 0.0),
        "skipped": int(log.summary.get("skipped_too_long", 0)) + int(log.summary.get("skipped_kv_full", 0)),
    }
