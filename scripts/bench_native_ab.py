"""Two builds of the native kernels in one Engine, alternating step by step: is a kernel change faster?

    .venv/bin/python scripts/bench_native_ab.py                          # HEAD's kernels (A) against the tree's (B)
    .venv/bin/python scripts/bench_native_ab.py --base HEAD~3 --prompt 2000 --rounds 3
    .venv/bin/python scripts/bench_native_ab.py --quant gguf

The memory of a shared host changes speed within seconds (here between about 35 and 68 GB/s), so two builds run in
turn, or in two processes, differ by more than a kernel change does. Here one Engine (SmolLM2, `--threads`
fixed, cache off) decodes `--tokens` tokens after a `--prompt`-token prompt, `--rounds` times, and its decode
layers' native call (`native_decode_layers`, every decoder layer of a step) goes to build A at odd steps and to
build B at even ones. Each pair of adjacent steps gives one ratio B/A of the call's wall time; the first 4 steps of
a round are left out. A is `--base`'s sources (a git revision of this repository: `runtime/native/*.c` and `*.h`
as committed there), compiled with the same flags into a temporary folder; B is the working tree's (the build the
Engine uses). Where `--base`'s `*.c` and `*.h` are byte for byte the tree's (the default HEAD of a tree with no
kernel change: an A/A run, which shows the noise floor), A is not compiled: the tree's cached build is copied into
the temporary folder and loaded from there (a file of its own, so a dlopen handle of its own: the two builds keep
separate state, such as their helper threads), and the output says so. The rest of the step (the head, the Python)
runs B's. Prints each round's medians and, at the end, the median ratio over all pairs with its quartiles: below 1,
B is faster.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# The two builds share the process's cores. An OpenMP team's workers spin on after their build's call (runtime's
# default below: 300,000 iterations, a few ms) into the other build's step, where decode_team.c's helper threads
# (team_pool.c's, not OpenMP's) must share the cores with them: B/A read 1.34 on an idle machine for a change whose
# steps differ by 1.02 when the workers sleep after 1,000 (2026-12-07). So unless GOMP_SPINCOUNT is set, the short
# spin libgomp itself takes once a process has more OpenMP threads than CPUs. (A lone engine's decode steps were no
# slower with the long spin: `doctor --quant gguf` 92, 85, 87 tok/s against 85, 82, 70 with 1,000, runs alternating.)
os.environ.setdefault("GOMP_SPINCOUNT", "1000")
# Then: runtime sets libgomp's other spin defaults, which only take effect if torch is not loaded yet.
import radixcache.runtime  # noqa: F401

# isort: split
import argparse
import ctypes
import io
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

# torch, the kernels and the engine are imported where they are used, after the arguments are checked: a bad one is
# refused at once, not after the seconds torch takes to import.

ROOT = Path(__file__).resolve().parent.parent
SKIP_STEPS = 4  # each round's first steps (the mirror and caches settling)


def extract_revision(rev: str, folder: Path) -> None:
    """`rev`'s runtime/native written under `folder` (before torch loads: a revision git does not know is refused at
    once)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "runtime/native"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise SystemExit(f"git archive {rev} runtime/native failed: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")


def build_revision(rev: str, folder: Path, tree_build: str) -> tuple[ctypes.CDLL, bool]:
    """`rev`'s kernels (extract_revision's, in `folder`) compiled as runtime.native compiles the tree's, and loaded;
    where they are the tree's byte for byte, a copy of `tree_build` (the tree's cached build). Also: whether copied."""
    import radixcache.runtime.native as native

    base = folder / "runtime" / "native"
    sources = sorted(str(p) for p in base.glob("*.c"))
    out = folder / "base.so"
    copied = same_sources(base, ROOT / "runtime" / "native")
    if copied:
        shutil.copyfile(tree_build, out)
    else:
        compiler = os.environ.get("CC", "cc")
        cmd = [compiler, *native.FLAGS, *sources, "-o", str(out), *native.LIBS]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"building {rev}'s kernels failed:\n{proc.stderr[-2000:]}")
    try:
        return native.load_library(out), copied
    except AttributeError as exc:  # a revision older than a function the loader declares
        raise SystemExit(f"{rev}'s kernels lack a function this tree declares: {exc}") from exc


def same_sources(a: Path, b: Path) -> bool:
    """Whether folders `a` and `b` hold the same `*.c` and `*.h` files, byte for byte."""
    names = sorted(p.name for p in a.iterdir() if p.suffix in (".c", ".h"))
    if names != sorted(p.name for p in b.iterdir() if p.suffix in (".c", ".h")):
        return False
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


class Alternating:
    """Stands in for the native library of the model's decode layers: `native_decode_layers` goes to `a` and `b` in
    turn (a first), timed; everything else to `b`."""

    def __init__(self, a: ctypes.CDLL, b: ctypes.CDLL) -> None:
        self._a, self._b = a, b
        self.calls = 0
        self.times: list[tuple[str, float]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._b, name)

    def native_decode_layers(self, *args: Any) -> int:
        self.calls += 1
        lib, tag = (self._a, "A") if self.calls % 2 else (self._b, "B")
        start = time.perf_counter()
        status = lib.native_decode_layers(*args)
        self.times.append((tag, time.perf_counter() - start))
        return status

    def native_team_quiesce(self) -> int:
        """Both builds' helpers out of their steps: the plan frees the mirror a step of either read after this."""
        for lib in (self._a, self._b):
            if hasattr(lib, "native_team_quiesce"):
                lib.native_team_quiesce()
        return 0


def pair_ratios(times: list[tuple[str, float]]) -> list[tuple[float, float]]:
    """(A's time, B's time) of each adjacent pair of steps, in order."""
    pairs = []
    for i in range(0, len(times) - 1, 2):
        (t1, x1), (_, x2) = times[i], times[i + 1]
        pairs.append((x1, x2) if t1 == "A" else (x2, x1))
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="the git revision whose kernels are A (default HEAD)")
    ap.add_argument("--quant", default="fp32", choices=["fp32", "gguf"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=129)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    if args.tokens < SKIP_STEPS + 3 or args.rounds < 1 or args.prompt < 1:
        raise SystemExit(f"--tokens must be at least {SKIP_STEPS + 3}, --rounds and --prompt at least 1")
    folder = Path(tempfile.mkdtemp(prefix="native-ab-"))
    try:
        extract_revision(args.base, folder)
        measure(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure(args: argparse.Namespace, folder: Path) -> None:
    """The A/B run of main's arguments, `--base`'s sources extracted in `folder`."""
    import torch

    import radixcache.runtime.native as native
    from radixcache.runtime import Engine
    from radixcache.runtime.loading import load_model
    from radixcache.runtime.model.llama import LlamaModel

    torch.set_num_threads(args.threads)
    lib_b = native.blockdot()
    lib_a, copied = build_revision(args.base, folder, lib_b._name)
    if copied:
        print(f"# {args.base}'s runtime/native sources are the working tree's: A is a copy of the tree's build")
    loaded = load_model("smollm2", keep_blocks=args.quant == "gguf")
    quant = "gguf" if args.quant == "gguf" else "none"
    blocks = loaded.blocks if quant == "gguf" else None
    model = LlamaModel(loaded.config, loaded.weights, quant=quant, blocks=blocks)
    if model.native_layers is None:
        raise SystemExit("this model runs no native decode layers here: nothing to compare")
    alternating = Alternating(lib_a, lib_b)
    model.native_layers._lib = alternating  # the one place a step's layers are called from
    model.native_layers.fuse_head = False  # the head in a call of its own: the layers' call alone alternates
    engine = Engine(model, threads=args.threads, thread_policy="fixed", enable_cache=False, kv_memory="256MiB")
    vocab = loaded.config.vocab_size
    ids = [1000 + (i * 7919) % (min(vocab, 30000) - 1000) for i in range(args.prompt)]
    engine.generate(ids, 8, ignore_eos=True)
    print(f"# A = {args.base}'s kernels, B = the working tree's; SmolLM2 {args.quant}, {args.threads} threads")
    ratios: list[float] = []
    for r in range(args.rounds):
        alternating.times.clear()
        engine.generate(ids, args.tokens, ignore_eos=True)
        pairs = pair_ratios(alternating.times[SKIP_STEPS:])
        if not pairs:
            raise SystemExit("no step ran the native decode layers: nothing to compare")
        these = [b / a for a, b in pairs]
        ratios += these
        a_ms = statistics.median(a for a, _ in pairs) * 1e3
        b_ms = statistics.median(b for _, b in pairs) * 1e3
        print(f"round {r + 1}: A {a_ms:.3f} ms, B {b_ms:.3f} ms, B/A {statistics.median(these):.4f}", flush=True)
    q1, q2, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    print(f"prompt {args.prompt}: B/A median {q2:.4f} over {len(ratios)} pairs (quartiles {q1:.4f}, {q3:.4f})")
    engine.close()


if __name__ == "__main__":
    main()
