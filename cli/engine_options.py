"""The engine's command-line options, shared by `replay`, `chat` and `serve`: the model, the KV cache (policy,
size, page size), admission, the tiers under the pool, and speed (quantisation, threads, the decode mirror, the
kernels).

Each group is a decorator that adds its options, and a function that turns their values into EngineConfig's keyword
arguments (runtime.engine.engine_config), refusing a bad size or combination before the model loads.
`engine_choice_options` stacks the four groups and hands the command one `EngineChoices` instead of their nineteen
values, so each command's signature names them once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console

from radixcache.policy.registry import ALL_POLICIES
from radixcache.runtime.engine.threads import MAX_THREADS  # no torch: the checks stay before the runtime loads

MODEL_ENVVAR = "RADIXCACHE_MODEL"
DEFAULT = ParameterSource.DEFAULT

#: --seed of replay and chat: request (turn) i samples with seed + i, which the engine takes in [-2**63, 2**64): an
#: int64 seed leaves room for any run (a larger one was refused once the model had loaded, or by the request past it)
SEED = click.IntRange(-(2**63), 2**63 - 1)

model_option = click.option(
    "--model",
    default="smollm2",
    show_default=True,
    envvar=MODEL_ENVVAR,
    help=f"'smollm2', a GGUF file or a Hugging Face directory (env {MODEL_ENVVAR}).",
)


def _stacked(func: Callable, options: list[Callable]) -> Callable:
    """`func` with `options` applied so that they appear in --help in the order listed."""
    for option in reversed(options):
        func = option(func)
    return func


def _check_sizes(sizes: dict[str, str | None]) -> None:
    """Each given size (by its option's name) parses as a memory budget; else a bad-option error naming it."""
    from radixcache.runtime.kv.pool import parse_memory

    for option, value in sizes.items():
        if value is None:
            continue
        try:
            parse_memory(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=f"'{option}'") from None


def kv_options(func: Callable) -> Callable:
    """--policy, --capacity-blocks, --kv-memory, --page-size: the engine's cache, shared with `chat`."""
    options = [
        click.option("--policy", default="lru", show_default=True, type=click.Choice(sorted(ALL_POLICIES))),
        click.option("--capacity-blocks", type=click.IntRange(min=1), help="KV cache size in pages."),
        click.option("--kv-memory", help="KV cache size in bytes, e.g. 256MiB [default: 512MiB]."),
        click.option("--page-size", default=16, show_default=True, type=click.IntRange(min=1), help="Tokens per page."),
    ]
    return _stacked(func, options)


def admission_option(func: Callable) -> Callable:
    """--admission: how many of each request's pages the tree adopts (radixcache.policy.admission), for replay, chat and
    serve."""
    from radixcache.policy.admission import ADMISSION_POLICIES

    return click.option(
        "--admission",
        default="all",
        show_default=True,
        type=click.Choice(sorted(ADMISSION_POLICIES)),
        help="Admission policy: how many of each request's pages the cache adopts (all: every one); the pages it "
        "declines are freed when the request ends instead of waiting for eviction.",
    )(func)


def check_admission(admission: str, policy: str) -> str:
    """`admission` itself when it works with the eviction `policy` (a learned admission may need its own eviction
    policy); otherwise a bad-option error, before the model loads."""
    from radixcache.policy.admission import make_admission
    from radixcache.policy.registry import make_policy

    try:
        make_admission(admission, eviction=make_policy(policy))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--admission'") from None
    return admission


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
            "copied back when that is cheaper than recomputing them.",
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
    return _stacked(func, options)


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
    _check_sizes({"--host-kv-memory": host_kv_memory, "--cache-dir-size": cache_dir_size})
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


def speed_options(func: Callable) -> Callable:
    """--quant, --gguf-activations, --threads, --thread-policy, --mirror-memory and the kernel options: how the model
    runs, shared by replay, chat and serve."""
    options = [
        click.option(
            "--quant",
            default="none",
            show_default=True,
            type=click.Choice(["none", "fp16", "gguf"]),
            help="Weight format: fp16 reads half the bytes per token (CPU, float32 activations); gguf keeps a GGUF "
            "file's own blocks (Q4_0 to Q8_0, Q4_K, Q5_K, Q6_K) for decode batches of up to 8 (same weights; needs "
            "a C compiler once).",
        ),
        click.option(
            "--gguf-activations",
            type=click.Choice(["int16-decode", "float", "int16", "int8-decode", "int8", "auto"]),
            help="With --quant gguf, the block kernels' activations: int16-decode (the default: decode rows of "
            "K-quant matrices rounded to 16 bits per 32 values, integer products; every other row float32); float "
            "(float32 throughout: the "
            "cache, batch and thread count move no logit by more than 1e-4, against int16's 1e-2); int8-decode "
            "(decode rows rounded to int8 per 32 values, as llama.cpp does: faster, near-ties of up to 1 move); "
            "int16 / int8 (every pass); auto (the fastest kernel per matrix) [default: "
            "$RADIXCACHE_GGUF_ACTIVATIONS, else int16-decode].",
        ),
        click.option(
            "--threads", type=click.IntRange(1, MAX_THREADS), help="torch threads [default: torch's, one per core]."
        ),
        click.option(
            "--thread-policy",
            default="adaptive",
            show_default=True,
            type=click.Choice(["adaptive", "fixed"]),
            help="adaptive: fewer threads while other programs take the cores, back when they leave (the engine "
            "measures it: runtime.engine.threads); fixed: always --threads (benchmarks, pinned cores).",
        ),
        click.option(
            "--mirror-memory",
            help="Most memory for the decode mirror (the decode batch's KV kept contiguous so that decode "
            "attention copies nothing per step), e.g. 256MiB; 0 turns it off [default: 512MiB on the CPU].",
        ),
        *kernel_options(),
    ]
    return _stacked(func, options)


def kernel_options() -> list[Callable]:
    """--kernels and --retune-kernels: how the float32 products pick their kernel (runtime.model.kernel_tune)."""
    return [
        click.option(
            "--kernels",
            type=click.Choice(["auto", "fixed"]),
            help="auto: the kernels measured fastest on this machine (measured at the first load, a few seconds, "
            "then cached per CPU, torch, threads and model); fixed: the built-in rules "
            "[default: $RADIXCACHE_KERNELS, else auto].",
        ),
        click.option(
            "--retune-kernels",
            is_flag=True,
            help="Measure the kernels again and replace the cached choice (after a torch upgrade, or when the "
            "first measurement ran on a busy machine).",
        ),
    ]


def kernel_mode(kernels: str | None, retune_kernels: bool) -> str | None:
    """EngineConfig.kernels from --kernels and --retune-kernels (None: the environment's or the default)."""
    if retune_kernels:
        if kernels == "fixed":
            raise click.UsageError("--retune-kernels measures the kernels; --kernels fixed does not use them")
        return "retune"
    return kernels


def engine_kwargs(
    policy: str,
    capacity_blocks: int | None,
    kv_memory: str | None,
    page_size: int,
    quant: str = "none",
    threads: int | None = None,
    mirror_memory: str | None = None,
    kernels: str | None = None,
    thread_policy: str = "adaptive",
    gguf_activations: str | None = None,
) -> dict[str, Any]:
    """Engine arguments from the kv and speed options; a bad --kv-memory or --mirror-memory, --gguf-activations
    without --quant gguf, or --quant gguf with a $RADIXCACHE_GGUF_ACTIVATIONS that names no mode, is refused before
    the model loads. `kernels`: kernel_mode's value."""
    if capacity_blocks is not None and kv_memory is not None:
        raise click.UsageError("give at most one of --capacity-blocks and --kv-memory")
    if gguf_activations is not None and quant != "gguf":
        raise click.UsageError(f"--gguf-activations {gguf_activations} applies to --quant gguf (got --quant {quant})")
    if gguf_activations is None:
        from radixcache.runtime.model.quant import check_gguf_activations

        try:
            check_gguf_activations(None, quant)  # $RADIXCACHE_GGUF_ACTIVATIONS, which a misspelling makes no mode
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    if mirror_memory is not None and mirror_memory.strip() == "0":
        mirror_memory = "0"  # off: not a budget
    _check_sizes({"--kv-memory": kv_memory, "--mirror-memory": None if mirror_memory == "0" else mirror_memory})
    kwargs: dict[str, Any] = {"policy": policy, "capacity_blocks": capacity_blocks, "kv_memory": kv_memory}
    kwargs |= {"page_size": page_size, "quant": quant, "threads": threads, "mirror_memory": mirror_memory}
    kwargs |= {"kernels": kernels, "thread_policy": thread_policy}
    return kwargs | ({"gguf_activations": gguf_activations} if gguf_activations is not None else {})


def load_engine_model(spec: str, quant: str = "none") -> Any:
    """The loaded model (config, weights, tokenizer; GGUF blocks for --quant gguf); a missing model raises
    ModelNotFoundError with the fix."""
    from radixcache.runtime.loading import load_model

    keep_blocks = quant == "gguf"
    console = Console(stderr=True)
    if not console.is_terminal:  # no spinner thread where nobody sees it (pipes, tests)
        return load_model(spec, keep_blocks=keep_blocks)
    with console.status(f"loading {spec}", spinner="dots"):
        return load_model(spec, keep_blocks=keep_blocks)


@dataclass(frozen=True, slots=True)
class EngineChoices:
    """What the cache, admission, tier and speed options chose, as given on the command line."""

    policy: str
    capacity_blocks: int | None
    kv_memory: str | None
    page_size: int
    admission: str
    host_kv_memory: str | None
    cache_dir: str | None
    cache_dir_size: str
    write_policy: str
    prefetch_policy: str
    prefetch_timeout_ms: float
    prefetch_pages_per_step: int
    quant: str
    gguf_activations: str | None
    threads: int | None
    thread_policy: str
    mirror_memory: str | None
    kernels: str | None
    retune_kernels: bool

    def engine_kwargs(self, no_cache: bool = False) -> dict[str, Any]:
        """The Engine's keyword arguments for these choices; a bad size, a size given twice, an admission policy
        that does not work with the eviction policy, or tiers under `--no-cache` (which keeps no pages for them: the
        engine refused it once the model had loaded) is a bad-option error, before the model loads."""
        if no_cache and (self.host_kv_memory is not None or self.cache_dir is not None):
            raise click.UsageError("--no-cache keeps no pages to put in tiers: drop --host-kv-memory and --cache-dir")
        kwargs = engine_kwargs(
            self.policy,
            self.capacity_blocks,
            self.kv_memory,
            self.page_size,
            self.quant,
            self.threads,
            self.mirror_memory,
            kernel_mode(self.kernels, self.retune_kernels),
            self.thread_policy,
            self.gguf_activations,
        )
        kwargs |= tier_kwargs(
            self.host_kv_memory,
            self.cache_dir,
            self.cache_dir_size,
            self.write_policy,
            self.prefetch_policy,
            self.prefetch_timeout_ms,
            self.prefetch_pages_per_step,
        )
        return kwargs | {"admission": check_admission(self.admission, self.policy)}

    def load_model(self, spec: str) -> Any:
        """The model for these choices (its GGUF blocks kept for --quant gguf)."""
        return load_engine_model(spec, self.quant)


_CHOICES = tuple(f.name for f in fields(EngineChoices))


def engine_choice_options(func: Callable) -> Callable:
    """The cache, admission, tier and speed options, in that order in --help, passed to `func` as one keyword
    argument, `engine_choices` (an EngineChoices)."""

    @functools.wraps(func)
    def gathered(*args: Any, **kwargs: Any) -> Any:
        choices = EngineChoices(**{name: kwargs.pop(name) for name in _CHOICES})
        return func(*args, engine_choices=choices, **kwargs)

    return kv_options(admission_option(tier_options(speed_options(gathered))))
