"""Kernels chosen by measurement: at load, time each float32 linear path (model.linear's PATHS: F.linear, the
transposed MKL product, oneDNN on the reordered weight, the native densedot.c product at decode buckets) for each
of the model's weight shapes at each row bucket
(model.kernel_plan's BUCKETS), keep the fastest (the native product where it is within NATIVE_CREDIT of it: what
it enables, the whole decode pass in one native call, no product's timing shows), and cache the choice per machine,
torch, thread count, model and choice rule.

Why: the fixed rules were measured on one machine and are wrong on another (on one 2-core AVX-512 VM, batch-1 fp32
decode ran at 17 tok/s where F.linear everywhere gives HF transformers 22 to 23). Every path computes the same
product; only the float32 summation order differs.

How a bucket is timed. Decode buckets (1 to 8 rows) read every weight once per step, so their cost is the memory
read, and a weight timed alone in a loop would sit in the cache and measure the wrong thing. So a decode bucket
runs the model's own sequence of products (layer by layer, lm_head last) with each product timed on its own, the
path rotating from product to product and sweep to sweep so that in each round every layer runs every path once,
between the other layers' products, as in a real step: each weight comes from memory as it does when the model
decodes. Larger buckets are compute-bound: a few layers of each shape suffice (at most about FLOP_CAP floating
point operations per sweep; a shape whose one layer is far over it, lm_head at 64 or 256 rows, keeps its largest
timed bucket's path). A path's time is the sum over its layers of each layer's fastest of `rounds` rounds (noise
from other programs only adds time), after one untimed call of each path and shape.

A busy machine says nothing about an idle one: other programs deschedule a thread of the team, and every parallel
kernel then waits for it at its barrier (tens of milliseconds a product). So the measurement watches how many of
this process's threads wait for a core (machine.run_queue_wait; CPU time against wall time where that is
missing), and once it has run BUSY_AFTER_S with BUSY_WAITING threads or more waiting on average it stops: this run
keeps the fixed rules, nothing is cached, and a warning says so. The next start measures again.

`choose_kernels(model, mode, threads)`: "fixed" keeps the fixed rules; "auto" reads the cached plan or measures and
caches one; "retune" measures again and replaces the cache. Each returns the KernelPlan it applied (`source`
"cache", "measured", or "fixed" with a `note` saying why). SmolLM2-135M takes about 3 s to measure on 2 idle cores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator

import torch

from radixcache.runtime.machine import cpu_model, kernel_flags, load_average, run_queue_wait
from radixcache.runtime.model.kernel_plan import (
    BUCKETS,
    KERNEL_MODES,
    KernelPlan,
    plan_key,
    read_plan,
    shape_name,
    write_plan,
)
from radixcache.runtime.model.linear import PATHS, DenseLinear
from radixcache.runtime.native import source_digest

DECODE_ROWS = 8  # buckets up to this many rows are timed over every layer (memory-bound); larger ones over a few
FLOP_CAP = 1.0e9  # floating point operations per sweep of a compute-bound bucket, all shapes together
ROUNDS = 3
BUSY_WAITING = 0.3  # threads waiting for a core, on average: past this the timings say nothing (module docstring)
BUSY_AFTER_S = 0.3  # the busy check needs this much measuring first
# A decode bucket's products timed one by one cannot see what "native" for every product enables: the whole pass
# in one native call (model.native_layers; about 15% of a SmolLM2 step on 2 cores). With the MKL product within 2-4%
# of the native one per product, a plan that took MKL at 1 and 2 rows decoded at 40 tok/s where the same machine's
# earlier plan, native there, decoded at 51-57 (bench_fp32_decode.py, 2026-12-05). So "native" keeps a bucket unless
# another path is faster by more than this share of its time.
NATIVE_CREDIT = 0.15
CHOICE_RULE = f"fastest; native within {NATIVE_CREDIT:g}"  # in a plan's key: one chosen by another rule is redone
log = logging.getLogger("radixcache.kernels")


class MachineBusy(RuntimeError):
    """The measurement stopped: other programs held the cores (the message says how many threads waited)."""


class BusyGuard:
    """Raises MachineBusy from `check()` once `after_s` have passed with `threshold` threads or more waiting for a
    core on average. `wait` reads the cumulative run-queue wait (None: unavailable, then CPU time is used)."""

    def __init__(
        self,
        threads: int,
        threshold: float | None = None,
        after_s: float | None = None,
        wait: Callable[[], float | None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.threads = threads
        self.threshold = BUSY_WAITING if threshold is None else threshold  # module values read now: tests set them
        self.after_s = BUSY_AFTER_S if after_s is None else after_s
        self._wait = run_queue_wait if wait is None else wait
        self._clock = clock
        self._t0, self._w0, self._c0 = clock(), self._wait(), time.process_time()
        self._next = self._t0 + self.after_s

    def waiting(self) -> float:
        """Threads waiting for a core, on average since the guard was made."""
        elapsed = max(self._clock() - self._t0, 1e-9)
        w = self._wait() if self._w0 is not None else None
        if w is not None and self._w0 is not None:
            return (w - self._w0) / elapsed
        return max(0.0, self.threads - (time.process_time() - self._c0) / elapsed)

    def check(self) -> None:
        now = self._clock()
        if now < self._next:
            return
        self._next = now + 0.05  # the probe reads a file per thread: at most 20 times a second
        waiting = self.waiting()
        if waiting >= self.threshold:
            raise MachineBusy(f"{waiting:.2f} of {self.threads} threads waited for a core on average")


def model_linears(model: object) -> list[DenseLinear]:
    """The model's float32 dense products in forward order (each layer's qkv, o, gate_up, down; then lm_head). A
    quant="gguf" layer contributes the dense layer it runs above its native rows; fp16 layers have no choice."""
    found: list[DenseLinear] = []
    for layer in getattr(model, "layers", ()):
        for name in ("qkv", "o", "gate_up", "down"):
            found.extend(_dense(getattr(layer, name, None)))
    found.extend(_dense(getattr(model, "lm_head", None)))
    return found


def _dense(layer: object) -> list[DenseLinear]:
    if isinstance(layer, DenseLinear):
        return [layer]
    inner = getattr(layer, "dense", None)  # BlockLinear's float32 layer (model.block_linear)
    return [inner] if isinstance(inner, DenseLinear) else []


def _shape(layer: DenseLinear) -> str:
    return shape_name(layer.weight.shape[0], layer.weight.shape[1])


def tunable(model: object) -> list[DenseLinear]:
    """The layers a plan applies to: float32 dense layers on the CPU (others have one path); [] for none."""
    layers = model_linears(model)
    if not layers or not all(layer.can_run("mm_t") for layer in layers):
        return []
    return layers


def model_key(layers: list[DenseLinear], threads: int) -> dict:
    shapes: dict[str, int] = {}
    for layer in layers:
        shapes[_shape(layer)] = shapes.get(_shape(layer), 0) + 1
    flags = kernel_flags()
    # the native digest only where "native" runs here: a plan that chose it (the compiler present) is not applied
    # where it cannot run (no compiler now, the same cache folder), whose paths use_paths would refuse
    native = source_digest() if all(layer.can_run("native") for layer in layers) else ""
    return plan_key(shapes, threads, "float32", cpu_model(), flags, torch.__version__, native, CHOICE_RULE)


def choose_kernels(model: object, mode: str, threads: int) -> KernelPlan:
    """Apply the kernel plan `mode` asks for to `model`'s dense layers and return it (see the module docstring);
    a model with nothing to choose (not float32 on the CPU) keeps the fixed rules."""
    if mode not in KERNEL_MODES:
        raise ValueError(f"kernels must be one of {', '.join(KERNEL_MODES)}, got {mode!r}")
    layers = tunable(model)
    if mode == "fixed" or not layers:
        apply_plan(model_linears(model), None)
        return KernelPlan({}, {}, source="fixed", note="kernels='fixed'" if layers else "no float32 CPU layers")
    key = model_key(layers, threads)
    plan = read_plan(key) if mode == "auto" else None
    if plan is None:
        try:
            measured = measure_plan(layers, key, threads)
        except MachineBusy as exc:
            apply_plan(layers, None)
            log.warning("kernels not measured: the machine is busy (%s); fixed rules for this run", exc)
            return KernelPlan(key, {}, source="fixed", note=f"machine busy: {exc}")
        plan = dataclasses.replace(measured, path=write_plan(measured))
    apply_plan(layers, plan)
    return plan


def apply_plan(layers: list[DenseLinear], plan: KernelPlan | None) -> None:
    """Give each layer its shape's paths (the fixed rules with None, or for a shape the plan does not name)."""
    paths = {} if plan is None else {shape: plan.by_rows(shape) for shape in plan.choices}
    for layer in layers:
        layer.use_paths(paths.get(_shape(layer)))


def measure_plan(
    layers: list[DenseLinear], key: dict, threads: int, rounds: int = ROUNDS, guard: BusyGuard | None = None
) -> KernelPlan:
    """Time every path of every shape at every bucket with `threads` torch threads (see the module docstring);
    MachineBusy when `guard` (default: a BusyGuard for `threads`) finds the cores taken."""
    start = time.perf_counter()
    load = load_average()
    for layer in layers:  # every layer that can holds the reordered copy the onednn path reads
        layer.use_paths(("onednn", "onednn") if layer.can_run("onednn") else None)
    paths: dict[str, tuple[str, ...]] = {}
    for layer in layers:  # the paths that run for every layer of a shape
        have = paths.get(_shape(layer), PATHS)
        paths[_shape(layer)] = tuple(p for p in have if layer.can_run(p))
    timings: dict[str, dict[int, dict[str, float]]] = {shape: {} for shape in paths}
    with _threads(threads), torch.inference_mode():
        guard = guard if guard is not None else BusyGuard(threads)
        for rows in BUCKETS:
            for shape, times in _time_bucket(layers, paths, rows, rounds, guard).items():
                timings[shape][rows] = times
    choices = {shape: _choose(by_bucket) for shape, by_bucket in timings.items()}
    return KernelPlan(key, choices, timings, "measured", time.perf_counter() - start, load)


def _choose(by_bucket: dict[int, dict[str, float]]) -> dict[int, str]:
    """The fastest path per bucket, except that "native" keeps a bucket it is timed at unless another path beats
    it by more than NATIVE_CREDIT; a bucket left untimed takes the largest timed bucket's below it."""
    chosen: dict[int, str] = {}
    last = "linear"
    for bucket in BUCKETS:
        times = by_bucket.get(bucket)
        if times:
            last = min(times, key=times.__getitem__)
            if "native" in times and times["native"] <= times[last] * (1 + NATIVE_CREDIT):
                last = "native"
        chosen[bucket] = last
    return chosen


def _time_bucket(
    layers: list[DenseLinear], paths: dict[str, tuple[str, ...]], rows: int, rounds: int, guard: BusyGuard
) -> dict[str, dict[str, float]]:
    """{shape: {path: microseconds over the timed layers}} at `rows` rows. "native" is timed at decode buckets
    only: past 8 rows it reads the weight once per 8 rows, which a compute-bound bucket's GEMM never does."""
    paths = {s: tuple(p for p in ps if p != "native" or rows <= DECODE_ROWS) for s, ps in paths.items()}
    timed = _selection(layers, rows)
    gen = torch.Generator().manual_seed(rows)
    inputs = {n: torch.randn(rows, n, generator=gen) for n in {layer.weight.shape[1] for layer in timed}}
    for shape in {_shape(layer) for layer in timed}:  # one untimed call each: oneDNN builds its primitive once
        first = next(layer for layer in timed if _shape(layer) == shape)
        for path in paths[shape]:
            first.run(path, inputs[first.weight.shape[1]])
    best: dict[tuple[int, str], float] = {}
    width = max(len(paths[_shape(layer)]) for layer in timed)
    clock = time.perf_counter
    for _ in range(rounds):
        for sweep in range(width):
            for i, layer in enumerate(timed):
                choices = paths[_shape(layer)]
                path = choices[(sweep + i) % len(choices)]
                x = inputs[layer.weight.shape[1]]
                t = clock()
                layer.run(path, x)
                took = clock() - t
                if took < best.get((i, path), float("inf")):
                    best[(i, path)] = took
                guard.check()
    out: dict[str, dict[str, float]] = {}
    for (i, path), sec in best.items():
        by_path = out.setdefault(_shape(timed[i]), {})
        by_path[path] = by_path.get(path, 0.0) + sec * 1e6
    return out


def _selection(layers: list[DenseLinear], rows: int) -> list[DenseLinear]:
    """Every layer for a decode bucket; for a larger one the first few layers of each shape (in forward order)
    within FLOP_CAP, none of a shape whose one layer is over 8 shares of it."""
    if rows <= DECODE_ROWS:
        return layers
    shapes = {_shape(layer) for layer in layers}
    share = FLOP_CAP / len(shapes)
    taken: dict[str, int] = {}
    picked = []
    for layer in layers:
        flops = 2.0 * rows * layer.weight.numel()
        shape = _shape(layer)
        n = taken.get(shape, 0)
        if flops > 8 * share or (n >= 1 and (n + 1) * flops > share):
            continue
        taken[shape] = n + 1
        picked.append(layer)
    return picked


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
