"""Plot the JSON of `radixcache replay --json`: TTFT against the cached fraction of each prompt, and the
cumulative hit rate over requests. A `--compare` file plots both runs.

    .venv/bin/python scripts/plot_replay.py replay.json --out replay.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from radixcache.errors import RadixCacheError
from radixcache.runtime import atomic_file
from radixcache.trace.replay_output import ReplayLog, read_replay_json


def plot(log: ReplayLog, out: str | Path) -> Path:
    """Write a two-panel PNG (or any format matplotlib knows from the suffix) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [run for run in (log, log.no_cache) if run is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for run, color in zip(runs, ("tab:blue", "tab:orange"), strict=False):
        label = run.summary.get("label", "run")
        reqs = run.requests
        fraction = [r["cached_tokens"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0 for r in reqs]
        left.scatter(fraction, [r["ttft_s"] * 1000 for r in reqs], s=18, alpha=0.75, color=color, label=label)
        cached = prompt = 0
        curve = []
        for r in reqs:
            cached += r["cached_tokens"]
            prompt += r["prompt_tokens"]
            curve.append(cached / prompt if prompt else 0.0)
        right.plot(range(1, len(curve) + 1), curve, color=color, label=label)
    left.set(xlabel="cached fraction of the prompt", ylabel="TTFT (ms)", title="TTFT per request", xlim=(-0.03, 1.03))
    right.set(xlabel="requests", ylabel="hit rate so far", title="cumulative hit rate", ylim=(0, 1))
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
    model = log.summary.get("model", "")
    fig.suptitle(f"radixcache replay: {model}, {log.summary.get('mode', '')} mode, {len(log.requests)} requests")
    fig.tight_layout()
    out = Path(out)
    try:  # written whole (a staging file moved onto it): a plot cut short never replaces an earlier one
        with atomic_file.staged(out) as staging:
            fig.savefig(staging, dpi=110, format=image_format(out))
    finally:
        plt.close(fig)
    return out


def image_format(out: Path) -> str:
    """The image format `out`'s suffix names (matplotlib's default, png, for none): the staging file's name keeps no
    suffix for matplotlib to read it from."""
    import matplotlib

    return out.suffix.lstrip(".").lower() or matplotlib.rcParams["savefig.format"]


def check_out(out: Path) -> str | None:
    """Why the plot cannot be written to `out`, or None: checked before the plot is drawn, where a missing folder or
    an unknown suffix was a traceback from matplotlib's savefig."""
    try:
        import matplotlib.figure
    except ImportError:
        return "the plot needs matplotlib, which is not installed: pip install matplotlib"
    folder = out.parent
    if not folder.is_dir():
        return f"--out {out}: the folder {folder} does not exist"
    supported = matplotlib.figure.Figure().canvas.get_supported_filetypes()
    if image_format(out) not in supported:
        kinds = ", ".join(sorted(supported))
        return f"--out {out}: matplotlib writes no {image_format(out)!r} images; give a suffix of {kinds}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", help="the file `radixcache replay --json PATH` wrote")
    parser.add_argument("--out", default="replay.png", help="image to write (default: replay.png)")
    args = parser.parse_args(argv)
    try:
        log = read_replay_json(args.json)
    except RadixCacheError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    problem = check_out(Path(args.out))
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    try:
        print(f"wrote {plot(log, args.out)}", file=sys.stderr)
    except OSError as exc:  # a folder this user cannot write in, a full disk
        print(f"error: {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
