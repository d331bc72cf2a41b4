"""The engine's command-line options, shared by `replay`, `chat` and `serve`: the model, the KV cache (policy,
size, page size), admission, the tiers under the pool, and speed (quantisation, threads, the decode mirror, the
kernels).

Each group is a decorator that adds its options, and a function that turns their values into EngineConfig's keyword
arguments (runtime.engine.engine_config), refusing a bad size or combination before the model loads.
`engine_choice_options` stacks the four groups and hands the command one `EngineChoices` instead of their nineteen
values, so each command's signature names them once. The tier group lives in cli.tier_options, what the groups
share (stacking, size checks) in cli.option_parts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import click
from rich.console import Console

from radixcache.cli.option_parts import check_sizes, stacked
from radixcache.cli.tier_options import tier_kwargs, tier_options
from radixcache.policy.registry import ALL_POLICIES
from radixcache.runtime.engine.threads import MAX_THREADS  # no torch: the checks stay before the runtime loads

MODEL_ENVVAR = "RADIXCACHE_MODEL"

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


def kv_options(func: Callable) -> Callable:
    """--policy, --capacity-blocks, --kv-memory, --page-size: the engine's cache, shared with `chat`."""
    options = [
        click.option("--policy", default="lru", show_default=True, type=click.Choice(sorted(ALL_POLICIES))),
        click.option("--capacity-blocks", type=click.IntRange(min=1), help="KV cache size in pages."),
        click.option("--kv-memory", help="KV cache size in bytes, e.g. 256MiB [default: 512MiB]."),
        click.option("--page-size", default=16, show_default=True, type=click.IntRange(min=1), help="Tokens per page."),
    ]
    return stacked(func, options)


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
            "--threads",
            type=click.IntRange(1, MAX_THREADS),
            help="torch threads [default: torch's, at most the CPUs this process may use].",
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
    return stacked(func, options)


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
    check_sizes({"--kv-memory": kv_memory, "--mirror-memory": None if mirror_memory == "0" else mirror_memory})
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
