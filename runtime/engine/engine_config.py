"""EngineConfig: everything an Engine is built from, in one frozen object validated once.

`Engine(model, **options)` builds one from its keyword arguments (the field names below, one to one) and
`Engine(config=EngineConfig(...))` takes one whole; either way the checks below run exactly once, before any
weights load, and the engine's parts are built from fields that are known good. The errors are the ones the
engine has always raised (ValueError naming the option), and an unknown option is a TypeError naming it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from radixcache.policy.admission import AdmissionPolicy, make_admission
from radixcache.policy.registry import make_policy
from radixcache.runtime.engine.queue_limit import check_max_queue
from radixcache.runtime.engine.scheduler import SchedulerConfig
from radixcache.runtime.engine.threads import check_thread_policy, check_threads
from radixcache.runtime.kv.pool import parse_memory
from radixcache.runtime.kv.tier.coordinator import LoadCosts
from radixcache.runtime.kv.tier.prefetch_policy import (
    DEFAULT_PAGES_PER_STEP,
    DEFAULT_PREFETCH_POLICY,
    DEFAULT_PREFETCH_TIMEOUT_MS,
    check_pages_per_step,
    check_prefetch,
)
from radixcache.runtime.model.kernel_plan import KERNEL_MODES
from radixcache.runtime.model.llama import DEFAULT_CHUNK
from radixcache.runtime.model.quant import QUANT_MODES, check_gguf_activations
from radixcache.tier.tiered_cache import WRITE_POLICIES

DEFAULT_KV_MEMORY = "512MiB"
DEFAULT_MIRROR_MEMORY = "512MiB"
DEFAULT_CACHE_DIR_SIZE = "8GiB"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How to build an Engine (runtime.engine.engine).

    model: "smollm2", a GGUF path or an HF directory (loaded with runtime.loading), an already-loaded object
    with `.config`, `.weights` (and `.tokenizer`), or a LlamaModel; `tokenizer` overrides the loaded one.
    KV size: `capacity_blocks` pages, else `kv_memory` bytes (e.g. "2GiB"), else 512 MiB; `page_size` tokens per
    page; `policy` the eviction order. `enable_cache=False` runs the same engine with no reuse.
    Scheduling (engine.scheduler): `schedule` (lpm | fcfs | dfs-weight), `max_prefill_tokens` per step while
    nothing decodes, `mixed_prefill_tokens` per step while requests decode, `prefill_chunk` most tokens of one
    request per pass, `max_running` requests at once, `staged_prefill_attention` (beside decodes, a chunk of more
    attention work runs its layers over several passes; None: never), or a whole `scheduler_config` (then those
    six are unused).
    `max_pinned_fraction`: the most of the pool that pins may lock (a pin larger than it is a ValueError before the
    request is queued; one that the pins held would push past it is refused: its result's `pinned_tokens` is 0).
    Speed: `quant="fp16"` stores the weights in 16 bits (CPU, float32 activations only; runtime.model.linear);
    `quant="gguf"` keeps a GGUF file's blocks for decode batches of up to 8 (the same weights; native kernels built
    on first use: runtime.model.block_linear; a loaded model needs `keep_blocks`), and `gguf_activations` picks
    their kernel when the engine builds the model: "int16-decode" (the default, else `$RADIXCACHE_GGUF_ACTIVATIONS`:
    decode rows' activations rounded to 16 bits per 32 values and integer products, prefill rows float32), "float"
    (float32 throughout: the cache, batch and thread count move no logit by more than ~1e-4; int16's ~1e-2),
    "int8-decode" (int8 per 32 values, as llama.cpp does: faster, and the cache, batch and thread count may then
    move a near-tie of up to ~1), "int16", "int8" or "auto";
    `threads` sets the torch threads of the engine loop (default: the constructing thread's count, at most the
    cores this process may use, its affinity and cgroup CPU quota: runtime.cores); with
    `thread_policy="adaptive"` (the default) the loop runs fewer while other programs take the cores and returns
    to `threads` when they are free (runtime.engine.threads), "fixed" always runs `threads`; `dtype` and
    `device` where the model runs. `kernels`: how the float32 products pick their kernel (runtime.model.kernel_tune):
    "auto" (the default) uses this machine's measured choice, cached per CPU, torch, thread count and model, and
    measures it at the first load (a few seconds); "retune" measures again; "fixed" keeps the built-in rules. None
    reads `$RADIXCACHE_KERNELS`, else "auto". `freeze_gc` (default True): once the engine has run a second, when its
    loop has stayed idle 0.25 s, the process's objects are collected once and hidden from Python's garbage collector
    (`gc.freeze`) until the engine closes, so that no full collection holds the loop for 100 ms at some step
    (runtime.engine.gc_heap); False leaves the collector alone.
    Overload: `max_queue` requests at most wait for admission (past it `submit` raises QueueFullError at once,
    queueing nothing); `queue_timeout` seconds at most a request waits to be admitted (then its result raises
    QueueTimeoutError; one call's requests until the first of them is admitted: queue_limit). Both errors carry
    `retry_after` (runtime.engine.errors).
    `mirror_memory`: the most memory the decode mirror (runtime.kv.mirror: the decode batch's KV kept contiguous, so
    decode attention copies nothing per step) may take; default 512 MiB on the CPU and off on other devices, 0
    turns it off.
    Tiers (docs/tiers.md): `host_kv_memory` bytes of pages in host memory under the pool, `cache_dir` a directory of
    pages that survives restarts (at most `cache_dir_size` bytes; either with `enable_cache=False` is a ValueError:
    no cache keeps no pages), `write_policy` when the host gets a copy (write_through, write_through_selective,
    write_back), `load_back` "auto" (load a page found below the pool when
    that is measured cheaper than recomputing it), "always" or "never". A prompt that continues on disk has those
    pages read off the loop before it is admitted (runtime.kv.tier.prefetch): `prefetch_policy` "timeout" (the
    default: wait for them at most `prefetch_timeout_ms`, default 1000, then use what arrived), "wait_complete" or
    "best_effort" (admit when it would be anyway, with what arrived); the rest is recomputed. While requests decode
    the readers start at most `prefetch_pages_per_step` page reads a step (default 16; more when a timeout needs
    them; 0: unpaced), so that a disk read costs the running decodes a bounded share of each step.
    `kv_events=True` keeps the engine's `events` (runtime.kv.events.KVEventLog): the keys of the pages the tree
    adopts and evicts, in numbered batches, for a router's index.
    Admission (radixcache.policy.admission): `admission` ("all", the default: adopt every page; another name in
    ADMISSION_POLICIES, or an AdmissionPolicy) decides how many of each request's pages the tree adopts.
    Leases (runtime.kv.leases, a request's `retain_for`): together they lock at most `lease_fraction` of the pool
    (past it the oldest gives way); `lease_clock` is the clock their deadlines are on (seconds; `time.monotonic`
    by default; tests pass one they advance); one that raises or gives no finite number fails no request (the
    leases wait for it, a warning is logged).
    """

    model: Any = "smollm2"
    kv_memory: str | int | None = None
    capacity_blocks: int | None = None
    page_size: int = 16
    policy: str = "lru"
    dtype: str | torch.dtype = "float32"
    device: str | torch.device = "cpu"
    enable_cache: bool = True
    prefill_chunk: int = DEFAULT_CHUNK
    tokenizer: Any = None
    schedule: str = "lpm"
    max_prefill_tokens: int = 1024
    mixed_prefill_tokens: int = 24
    staged_prefill_attention: int | None = None
    max_running: int = 64
    scheduler_config: SchedulerConfig | None = None
    max_pinned_fraction: float = 0.25
    quant: str = "none"
    gguf_activations: str | None = None
    threads: int | None = None
    mirror_memory: str | int | None = None
    max_queue: int | None = None
    queue_timeout: float | None = None
    host_kv_memory: str | int | None = None
    cache_dir: str | os.PathLike[str] | None = None
    cache_dir_size: str | int = DEFAULT_CACHE_DIR_SIZE
    write_policy: str = "write_through"
    load_back: str = "auto"
    prefetch_policy: str = DEFAULT_PREFETCH_POLICY
    prefetch_timeout_ms: float = DEFAULT_PREFETCH_TIMEOUT_MS
    prefetch_pages_per_step: int = DEFAULT_PAGES_PER_STEP
    kv_events: bool = False
    admission: str | AdmissionPolicy | None = "all"
    lease_fraction: float = 0.5
    lease_clock: Callable[[], float] | None = None
    thread_policy: str = "adaptive"
    kernels: str | None = None
    freeze_gc: bool = True

    def __post_init__(self) -> None:
        """Every check that needs no weights, in the order the engine has always made them."""
        resolve_dtype(self.dtype)
        make_admission(self.admission, eviction=make_policy(self.policy))  # a bad name fails before the model loads
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {', '.join(WRITE_POLICIES)}, got {self.write_policy!r}")
        check_threads(self.threads)
        check_thread_policy(self.thread_policy)
        self.kernel_mode()
        if self.quant not in QUANT_MODES:
            raise ValueError(f"quant must be one of {', '.join(QUANT_MODES)}, got {self.quant!r}")
        check_gguf_activations(self.gguf_activations, self.quant)
        if self.load_back not in LoadCosts.MODES:
            raise ValueError(f"load_back must be one of {', '.join(LoadCosts.MODES)}, got {self.load_back!r}")
        check_prefetch(self.prefetch_policy, self.prefetch_timeout_ms)
        check_pages_per_step(self.prefetch_pages_per_step)
        for name in ("page_size", "capacity_blocks"):  # the pool's shape: checked before the weights load
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        cache_dir = self.cache_dir
        path = os.fspath(cache_dir) if isinstance(cache_dir, (str, os.PathLike)) else None
        if cache_dir is not None and (not isinstance(path, str) or not path or "\0" in path):
            # "" would be the current directory, made a cache (or refused) without a word; a NUL byte, or a bytes
            # path, failed in the disk store once the weights had loaded, with an error that named no option
            raise ValueError(
                f"cache_dir must be a non-empty text path (str or os.PathLike) without NUL, or None, got {cache_dir!r}"
            )
        if not self.enable_cache and (cache_dir is not None or self.host_kv_memory is not None):
            # the tiers hold the cache's evicted pages: with no cache they would hold nothing, silently
            raise ValueError(
                "enable_cache=False keeps no pages, so cache_dir= and host_kv_memory= would be ignored: "
                "drop them or enable the cache"
            )
        for name in ("enable_cache", "kv_events", "freeze_gc"):  # "no" or 0 read as a truth value, silently
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("kv_memory", "host_kv_memory", "cache_dir_size", "mirror_memory"):  # cache_dir_size always
            budget = getattr(self, name)
            if budget is not None and not (name == "mirror_memory" and budget in (0, "0")):  # a mirror of 0 is off
                try:
                    parse_memory(budget)
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"{name}: {exc}") from None
        for name in ("max_pinned_fraction", "lease_fraction"):  # a string failed on a comparison, naming nothing
            share = getattr(self, name)
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
                raise ValueError(f"{name} must be a number in [0, 1], got {share!r}")
        if self.lease_clock is not None and not callable(self.lease_clock):
            raise ValueError(f"lease_clock must be a callable returning seconds, got {self.lease_clock!r}")
        self.scheduler()  # a scheduler_config of the wrong kind is refused there
        check_max_queue(self.max_queue)
        wait = self.queue_timeout
        if wait is not None and (isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait > 0):
            raise ValueError(f"queue_timeout must be > 0 seconds or None, got {wait!r}")
        # Objects of the wrong kind failed as AttributeErrors naming no option: a model while the engine was built,
        # a tokenizer at the first request (decode, even for token ids).
        model = self.model
        if model is not None and not isinstance(model, (str, os.PathLike)) and not hasattr(model, "config"):
            raise ValueError(f"model must be a name, a path or a loaded model (with .config), got {model!r:.60}")
        tok = self.tokenizer
        if tok is not None and not (callable(getattr(tok, "encode", None)) and callable(getattr(tok, "decode", None))):
            raise ValueError(f"tokenizer must have encode and decode methods (or be None), got {tok!r:.60}")

    @classmethod
    def of(cls, caller: str = "Engine", /, **options: Any) -> EngineConfig:
        """A config from keyword options (the field names); an unknown one is a TypeError naming it, as a
        function's signature would say."""
        _check_names(caller, options)
        return cls(**options)

    def replace(self, caller: str = "EngineConfig.replace", /, **options: Any) -> EngineConfig:
        """This config with `options` changed, validated again; an unknown option is a TypeError naming it."""
        _check_names(caller, options)
        return dataclasses.replace(self, **options)

    def scheduler(self) -> SchedulerConfig:
        """The scheduler's config: `scheduler_config` when given, else one built from the six scheduling fields."""
        given = self.scheduler_config
        if given is not None:
            if not isinstance(given, SchedulerConfig):  # a dict failed every request (AttributeError), not here
                raise ValueError(f"scheduler_config must be a SchedulerConfig or None, got {given!r:.60}")
            return given
        return SchedulerConfig(**{name: getattr(self, name) for name in _SCHEDULING})

    def kernel_mode(self) -> str:
        """`kernels`, else `$RADIXCACHE_KERNELS`, else "auto"; a value outside KERNEL_MODES is a ValueError."""
        mode = self.kernels
        where = "kernels"
        if mode is None:
            mode, where = os.environ.get("RADIXCACHE_KERNELS") or "auto", "RADIXCACHE_KERNELS"
        if mode not in KERNEL_MODES:
            raise ValueError(f"{where} must be one of {', '.join(KERNEL_MODES)}, got {mode!r}")
        return mode

    @property
    def torch_dtype(self) -> torch.dtype:
        return resolve_dtype(self.dtype)


_FIELDS = frozenset(f.name for f in dataclasses.fields(EngineConfig))
_SCHEDULING = (
    "schedule",
    "max_prefill_tokens",
    "mixed_prefill_tokens",
    "prefill_chunk",
    "max_running",
    "staged_prefill_attention",
)


def _check_names(caller: str, options: dict[str, Any]) -> None:
    unknown = next((name for name in options if name not in _FIELDS), None)
    if unknown is not None:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown!r}")
