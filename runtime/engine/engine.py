"""The Engine: the public face of one model, its paged KV pool and its radix cache, serving many requests at once.

The request life: tokenise; match the prompt less its last token; lock; allocate the remaining pages (evicting
if needed); prefill the rest in chunks, batched with other requests' chunks and the running decodes, committing
each chunk's full pages to the tree as they are computed; decode, committing pages as they fill; unlock; free the
unaligned tail page.

The parts, each in its own module: engine.scheduler (what runs in each step), engine.runner (one forward pass per
step), kv.manager (the only door to the tree), engine.output (sampling, stops, text, results) and engine.loop (the
thread that owns them all). This class builds them, validates requests, and offers the sync, async and streaming
APIs; callers on any thread or event loop submit to the loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import TYPE_CHECKING, Any

import torch

from radixcache import CacheStats, RadixCache
from radixcache.policy.admission import AdmissionPolicy, check_retain, make_admission
from radixcache.runtime.engine.admission import QueueGate
from radixcache.runtime.engine.errors import EngineClosedError
from radixcache.runtime.engine.loop import EngineLoop, RequestHandle
from radixcache.runtime.engine.output import OutputProcessor
from radixcache.runtime.engine.request import GenerationResult, Request
from radixcache.runtime.engine.runner import ModelRunner
from radixcache.runtime.engine.sampling import Sampler, SamplingParams, stop_token_set
from radixcache.runtime.engine.scheduler import Scheduler, SchedulerConfig
from radixcache.runtime.engine.trace_recorder import TraceRecorder
from radixcache.runtime.kv.events import KVEventLog
from radixcache.runtime.kv.manager import KVManager
from radixcache.runtime.kv.mirror import DecodeMirror
from radixcache.runtime.kv.pool import blocks_for_budget, parse_memory
from radixcache.runtime.kv.retention import RetentionPolicy
from radixcache.runtime.kv.tier.coordinator import TierCounters, build_tiers
from radixcache.runtime.kv.tier.fingerprint import file_digest, kv_fingerprint, weights_digest
from radixcache.runtime.model.llama import DEFAULT_CHUNK, LlamaModel
from radixcache.tier.tiered_cache import WRITE_POLICIES

if TYPE_CHECKING:
    from radixcache.runtime.engine.session import Session

Prompt = str | Sequence[int]
Messages = Sequence[dict[str, str]]

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
class EngineStats:
    """Engine totals since construction, plus the cache's block gauges now."""

    requests: int
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    generated_tokens: int
    capacity_blocks: int
    free_blocks: int
    evictable_blocks: int
    locked_blocks: int
    cache: CacheStats
    running: int = 0
    waiting: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0
    pinned_blocks: int = 0
    steps: int = 0
    tiers: TierCounters | None = None  # per-tier hits and page moves, with a host tier or a cache directory
    admission_declined_pages: int = 0  # computed full pages the admission policy kept out of the tree (freed)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the cache / prompt tokens (recomputation after preemption is not a hit)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Engine:
    """Generate text with a Llama-family model whose KV prefixes are shared through a radix cache.

    model: "smollm2", a GGUF path or an HF directory (loaded with runtime.loading), an already-loaded object
    with `.config`, `.weights` (and `.tokenizer`), or a LlamaModel. KV size: `capacity_blocks` pages, else
    `kv_memory` bytes (e.g. "2GiB"), else 512 MiB. `enable_cache=False` runs the same engine with no reuse.
    Scheduling (engine.scheduler): `schedule` (lpm | fcfs | dfs-weight), `max_prefill_tokens` per step while
    nothing decodes, `mixed_prefill_tokens` per step while requests decode, `prefill_chunk` most tokens of one
    request per pass, `max_running` requests at once, or a whole `scheduler_config`. `max_pinned_fraction`: the
    most of the pool that pins may lock (a pin past it is refused: its result's `pinned_tokens` is 0).
    Speed: `quant="fp16"` stores the weights in 16 bits (CPU, float32 activations only; runtime.model.linear);
    `quant="gguf"` keeps a GGUF file's Q4_1 / Q8_0 blocks for decode batches of up to 4 (the same weights, float32
    arithmetic, a native kernel built on first use: runtime.model.block_linear; a loaded model needs `keep_blocks`);
    `threads` sets the torch threads of the engine loop (default: the constructing thread's count).
    Overload: `max_queue` requests at most wait for admission (past it `submit` raises QueueFullError at once,
    queueing nothing); `queue_timeout` seconds at most a request waits to be admitted (then its result raises
    QueueTimeoutError). Both errors carry `retry_after` (runtime.engine.errors). A request that outgrows the pool
    while decoding ends with finish_reason "length" and the tokens it made.
    `mirror_memory`: the most memory the decode mirror (radixcache.runtime.kv.mirror: the decode batch's KV kept
    contiguous, so decode attention copies nothing per step) may take; default 512 MiB on the CPU and off on
    other devices, 0 turns it off. A batch that does not fit decodes from the pages as before.
    Tiers (docs/tiers.md): `host_kv_memory` bytes of pages in host memory under the pool, `cache_dir` a directory of
    pages that survives restarts (at most `cache_dir_size` bytes), `write_policy` when the host gets a copy
    (write_through, write_through_selective, write_back), `load_back` "auto" (load a page found below the pool when
    that is measured cheaper than recomputing it), "always" or "never". `flush()` waits for queued disk writes.
    `kv_events=True` keeps `events` (runtime.kv.events.KVEventLog): the keys of the pages the tree adopts and evicts,
    in numbered batches, for a router's index.
    Admission (radixcache.policy.admission): `admission` ("all", the default: adopt every page; another name in
    ADMISSION_POLICIES, or an AdmissionPolicy) decides how many of each request's pages the tree adopts; the rest
    are freed when the request leaves (`stats.admission_declined_pages`). A request's `retain="conversation"` makes
    the tree adopt all of its pages whatever the policy predicts.

    Thread-safe: every call submits to one engine loop thread that owns the cache and the pool.
    """

    def __init__(
        self,
        model: Any = "smollm2",
        *,
        kv_memory: str | int | None = None,
        capacity_blocks: int | None = None,
        page_size: int = 16,
        policy: str = "lru",
        dtype: str | torch.dtype = "float32",
        device: str | torch.device = "cpu",
        enable_cache: bool = True,
        prefill_chunk: int = DEFAULT_CHUNK,
        tokenizer: Any = None,
        schedule: str = "lpm",
        max_prefill_tokens: int = 1024,
        mixed_prefill_tokens: int = 24,
        max_running: int = 64,
        scheduler_config: SchedulerConfig | None = None,
        max_pinned_fraction: float = 0.25,
        quant: str = "none",
        threads: int | None = None,
        mirror_memory: str | int | None = None,
        max_queue: int | None = None,
        queue_timeout: float | None = None,
        host_kv_memory: str | int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_dir_size: str | int = DEFAULT_CACHE_DIR_SIZE,
        write_policy: str = "write_through",
        load_back: str = "auto",
        kv_events: bool = False,
        admission: str | AdmissionPolicy | None = "all",
    ) -> None:
        torch_dtype = resolve_dtype(dtype)
        retention = RetentionPolicy(policy)  # the cache's eviction order, which a "reuse" admission learns from
        admission_policy = make_admission(admission, eviction=retention)  # a bad name fails before the model loads
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {', '.join(WRITE_POLICIES)}, got {write_policy!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        if isinstance(model, (str, os.PathLike)):
            from radixcache.runtime.loading import load_model

            load_dtype = torch.float32 if torch_dtype == torch.float64 else torch_dtype  # float64: tests only
            model = load_model(str(model), dtype=load_dtype, device=device, keep_blocks=quant == "gguf")
        weights_id = _weights_identity(model) if cache_dir is not None and enable_cache else ""
        if isinstance(model, LlamaModel):
            if quant != "none" and quant != model.quant:
                raise ValueError(f"quant={quant!r} applies when the engine builds the model; pass it to LlamaModel")
            self.model = model
        else:
            blocks = getattr(model, "blocks", None)
            self.model = LlamaModel(
                model.config, model.weights, dtype=torch_dtype, device=device, quant=quant, blocks=blocks
            )
            if weights_id:
                self.model.weights_id = weights_id  # an engine built later on this model fingerprints the same
            tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        self.tokenizer = tokenizer
        self.config = self.model.config
        if capacity_blocks is None:
            budget = kv_memory if kv_memory is not None else DEFAULT_KV_MEMORY
            capacity_blocks = blocks_for_budget(self.config, budget, page_size, self.model.dtype)
        if not 0.0 <= max_pinned_fraction <= 1.0:
            raise ValueError(f"max_pinned_fraction must be in [0, 1], got {max_pinned_fraction}")
        self.max_pinned_blocks = int(capacity_blocks * max_pinned_fraction)
        self.retention = retention
        self.cache = RadixCache(capacity_blocks, page_size, self.retention)
        self.pool = self.model.new_pool(capacity_blocks, page_size)
        self.tiers = None
        self.events: KVEventLog | None = None
        self.fingerprint = kv_fingerprint(self.config, self.pool, weights=weights_id, quant=self.model.quant)
        if enable_cache:
            self.tiers = build_tiers(
                self.cache,
                self.pool,
                host_kv_memory=host_kv_memory,
                cache_dir=None if cache_dir is None else os.fspath(cache_dir),
                cache_dir_size=cache_dir_size,
                write_policy=write_policy,
                load_back=load_back,
                fingerprint=self.fingerprint,
            )
            if kv_events:  # after the tiers: the log chains their eviction listener
                hasher = self.tiers.tiered.hasher if self.tiers is not None else None  # one hash per evicted leaf
                self.events = KVEventLog(self.cache, self.fingerprint, hasher=hasher)
        self.kv = KVManager(
            self.cache,
            enable_cache=enable_cache,
            retention=self.retention,
            max_pinned_blocks=self.max_pinned_blocks,
            tiers=self.tiers,
            events=self.events,
            admission=admission_policy,
        )
        self.admission = admission_policy
        self.mirror = self._make_mirror(mirror_memory)
        self.enable_cache = enable_cache
        tok_eos = tuple(getattr(tokenizer, "eos_token_ids", ()) or ())
        self.eos_token_ids = tuple(dict.fromkeys((*self.config.eos_token_ids, *tok_eos)))
        self.output = OutputProcessor(tokenizer, self.eos_token_ids, self.config.max_position)
        self.runner = ModelRunner(self.model, self.pool, self.mirror)
        if scheduler_config is None:
            scheduler_config = SchedulerConfig(
                schedule=schedule,
                max_prefill_tokens=max_prefill_tokens,
                mixed_prefill_tokens=mixed_prefill_tokens,
                prefill_chunk=prefill_chunk,
                max_running=max_running,
            )
        self.scheduler = Scheduler(self.runner, self.kv, self.output, scheduler_config)
        # The loop thread sets its own OpenMP thread count: a thread does not inherit its creator's setting.
        self.threads = threads if threads is not None else torch.get_num_threads()
        self._loop = EngineLoop(self.scheduler, self.output.result, num_threads=self.threads)
        self.queue = QueueGate(max_queue)
        if queue_timeout is not None and not queue_timeout > 0:
            raise ValueError(f"queue_timeout must be > 0 seconds or None, got {queue_timeout!r}")
        self.queue_timeout = queue_timeout
        self._closed = False

    # ------------------------------------------------------------------ public API: sync

    def generate(
        self,
        prompt: Prompt | Sequence[Prompt],
        max_new_tokens: int = 64,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        namespace: Hashable = None,
        params: SamplingParams | None = None,
        return_logits: bool = False,
        priority: int = 0,
        timeout: float | None = None,
        pin: bool | int = False,
        retention: int = 0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        min_p: float = 0.0,
        logit_bias: dict[int, float] | Sequence[tuple[int, float]] | None = None,
        logprobs: int | None = None,
        retain: str | None = None,
        session: str | None = None,
    ) -> Any:
        """Continue `prompt` (text, or token ids); a list of prompts runs them concurrently and returns a list.

        `params` replaces the individual sampling arguments. `priority`: higher is admitted first and preempted
        last. `timeout`: seconds, after which the request ends with finish_reason "timeout". `pin`: keep the
        prompt's KV (True) or its first n tokens' whole pages in the cache until `unpin`, within
        `max_pinned_fraction` (a pin past it is refused: the result's `pinned_tokens` is 0).
        `retention`: a soft priority for keeping the prompt's KV (higher is evicted later; see runtime.kv.retention).
        OpenAI / vLLM sampling: `presence_penalty` and `frequency_penalty` (over the generated tokens, [-2, 2]),
        `repetition_penalty` (over prompt and generated tokens, > 0), `min_p` ([0, 1]), `logit_bias` (`{token_id:
        bias}`, bias in [-100, 100]; applied to greedy too); `logprobs=k` (0..20) fills the result's `logprobs` with
        each token's raw log-probability and the top k (SamplingParams documents the order of processing).
        `retain="conversation"`: the next turn of this live conversation will read its pages (prompt and reply), so
        the tree adopts every one of them whatever the engine's admission policy predicts (None: no hint).
        `session`: the conversation the request belongs to, written as its `session_id` by `record_trace`.
        """
        kw = {k: v for k, v in locals().items() if k not in ("self", "prompt")}
        handles = self.submit(prompt, **kw)
        if isinstance(handles, RequestHandle):
            return self._wait([handles])[0]
        return self._wait(handles)

    def chat(self, messages: Messages | Sequence[Messages], max_new_tokens: int = 64, **kwargs: Any) -> Any:
        """Render `messages` with the model's chat template (adding the assistant turn) and generate.
        A list of conversations runs them concurrently and returns a list of results."""
        return self.generate(self._render(messages), max_new_tokens, **kwargs)

    def run(self, req: Request) -> GenerationResult:
        """Take one prepared request through its whole life. On any error its blocks are freed and its lock
        dropped."""
        if self._closed:
            raise EngineClosedError("this engine is closed")
        if req.sampler.params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        return self._wait(self._enqueue([req]))[0]

    def submit(self, prompt: Prompt | Sequence[Prompt], max_new_tokens: int = 64, **kwargs: Any) -> Any:
        """Queue `prompt` (or a list of prompts) without waiting: a RequestHandle (or a list of them) with
        `.result(timeout)`, `.future` and `.cancel()`. Takes generate's keyword arguments."""
        prompts, single = self._split_batch(prompt)
        reqs = [self._request(p, max_new_tokens, **kwargs) for p in prompts]  # all validated before any runs
        handles = self._enqueue(reqs)  # they reach the scheduler together, between two steps
        return handles[0] if single else handles

    def submit_group(
        self, prompts: Sequence[Prompt], max_new_tokens: int = 64, *, each: Sequence[dict[str, Any]] = (), **kwargs: Any
    ) -> list[RequestHandle]:
        """Queue prompts that belong to one call (the n samples of one prompt, fork branches) without waiting.

        They are queued together, so the first to run computes their common prefix and the others wait for its
        pages (in-flight sharing) instead of computing it too. Each reports as `cached_tokens` at most what the tree
        held of that common prefix when the call arrived: one sample's work for the others is not a cache hit.
        `each[i]`: keyword arguments for prompt i only (say its seed), over the shared `kwargs`.
        """
        if each and len(each) != len(prompts):
            raise ValueError(f"each has {len(each)} entries for {len(prompts)} prompts")
        reqs = [
            self._request(p, max_new_tokens, **{**kwargs, **(each[i] if each else {})}) for i, p in enumerate(prompts)
        ]
        return self._submit_group(reqs)

    def fork(
        self,
        prefix: Prompt | Messages,
        n: int = 4,
        max_new_tokens: int = 64,
        *,
        continuations: Sequence[Prompt] | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> list[GenerationResult]:
        """Run `n` branches from one prefix (text, ids or chat messages) that share its KV: the branches are
        queued together, the first computes the prefix and the others wait for its pages (in-flight sharing),
        then lock them. Branches differ by `continuations` (text or ids appended to the prefix, encoded without a
        second BOS) and/or by seed (`seed + i`; set a temperature for sampling).

        Each result's `cached_tokens` counts what was cached before the call: the prefix computed by one branch
        for the others is the call's own work, not a cache hit."""
        ids = self._encode(self._render(prefix) if _is_messages(prefix) else prefix)  # type: ignore[arg-type]
        if continuations is not None:
            n = len(continuations)
        if n < 1:
            raise ValueError(f"fork needs n >= 1, got {n}")
        tails = [self._encode_continuation(c) for c in continuations] if continuations is not None else [[]] * n
        reqs = [
            self._request(ids + tail, max_new_tokens, seed=None if seed is None else seed + i, **kwargs)
            for i, tail in enumerate(tails)
        ]
        return self._wait(self._submit_group(reqs))

    def session(self, system: str | None = None, **defaults: Any) -> Session:
        """A multi-turn chat whose history (and so its KV) grows turn by turn: `s.send("hi")`."""
        from radixcache.runtime.engine.session import Session

        return Session(self, system=system, **defaults)

    def unpin(self, prompt: Prompt | None = None, *, namespace: Hashable = None) -> int:
        """Release pins: those of `prompt` (in `namespace`), or every pin. Returns how many were released."""
        tokens = None if prompt is None else self._encode(prompt)
        _check_namespace(namespace)
        return self._loop.call(lambda _: self.kv.pins.unpin(tokens, namespace)).result()

    def close(self, timeout: float | None = 30.0) -> bool:
        """Refuse new requests (EngineClosedError), cancel every request in flight (their results say "cancelled",
        with what they generated), and wait for the loop thread to exit. The cache keeps what it holds. Returns False if
        the thread was still busy after `timeout` seconds. Calling it again is harmless."""
        self._closed = True

        def cancel_all(s: Scheduler) -> None:
            for r in [*s.waiting, *s.prefilling, *s.decoding]:
                s.abort(r, "cancelled")

        if not self._loop.idle():
            self._loop.call(cancel_all)
        idle = self._loop.wait_idle(timeout)
        if idle and self.tiers is not None:  # the disk writes still queued finish (a restart then finds them)
            self.tiers.close(timeout)
        self.record_trace(None)  # a recording writes what it still holds and closes its file
        return idle

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until the disk tier has written every page queued so far (True; False on timeout or no disk
        tier). Writes never delay requests; call this before a planned exit or to measure what is persisted."""
        if self.tiers is None or self.tiers.disk is None:
            return False
        return self.tiers.disk.flush(timeout)

    def record_trace(self, path: str | os.PathLike[str] | None) -> TraceRecorder | None:
        """Write every request that leaves from now on to `path`, one Mooncake-format JSONL line each: arrival time,
        lengths, chained page hashes at this engine's page size, the `session` given to `generate` (no text, no token
        id; runtime.engine.trace_recorder). `None` stops the recording and closes its file, as `close()` does.
        Returns the new recorder (its `written` counts lines), or None. A path that cannot be opened raises OSError;
        a write that fails later stops the recording with one warning, never a request."""
        recorder = TraceRecorder(path, self.cache.page_size, self.fingerprint) if path is not None else None
        previous, self._loop.recorder = self._loop.recorder, recorder
        if previous is not None:
            previous.close()
        return recorder

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is in flight and the engine's loop thread has exited (False on timeout).

        Call it after cancelling requests (say on Ctrl-C) before the process exits: a loop thread still inside
        torch at interpreter exit aborts the process.
        """
        return self._loop.wait_idle(timeout)

    def check(self, timeout: float | None = 30.0) -> dict[str, int]:
        """Check the cache's invariants between two steps (on the loop thread) and return its block gauges and
        queue lengths. Raises the cache's InvariantError if one is broken (a bug)."""

        def run(s: Scheduler) -> dict[str, int]:
            c = self.cache
            c.check_invariants()
            if self.tiers is not None:
                self.tiers.check()
            return {
                "capacity_blocks": c.capacity_blocks,
                "free_blocks": c.free_blocks,
                "evictable_blocks": c.evictable_blocks,
                "locked_blocks": c.locked_blocks,
                "held_blocks": c.held_blocks,
                "pinned_blocks": self.kv.pins.blocks,
                "running": len(s.prefilling) + len(s.decoding),
                "waiting": len(s.waiting),
            }

        return self._loop.call(run).result(timeout)

    def clear_retention(self) -> int:
        """Forget every retention mark (leaves re-rank as they are next touched). Returns how many there were."""
        return self._loop.call(lambda _: self.retention.clear()).result()

    @property
    def stats(self) -> EngineStats:
        c, t, s = self.cache, self.output.totals, self.scheduler
        return EngineStats(
            requests=t.requests,
            prompt_tokens=t.prompt,
            cached_tokens=t.cached,
            prefill_tokens=t.prefill,
            generated_tokens=t.generated,
            capacity_blocks=c.capacity_blocks,
            free_blocks=c.free_blocks,
            evictable_blocks=c.evictable_blocks,
            locked_blocks=c.locked_blocks,
            cache=c.stats,
            running=len(s.prefilling) + len(s.decoding),
            waiting=len(s.waiting),
            preemptions=s.preemptions,
            recomputed_tokens=t.recomputed,
            pinned_blocks=self.kv.pins.blocks,
            steps=s.steps,
            tiers=None if self.tiers is None else self.tiers.counters,
            admission_declined_pages=self.kv.declined_pages,
        )

    def __repr__(self) -> str:
        return f"Engine(model={self.config.name!r}, cache={self.cache!r}, enable_cache={self.enable_cache})"

    # ------------------------------------------------------------------ public API: asyncio

    async def agenerate(self, prompt: Prompt | Sequence[Prompt], max_new_tokens: int = 64, **kwargs: Any) -> Any:
        """`generate` for asyncio: awaits the engine loop without blocking the event loop. Cancelling the
        awaiting task cancels the request."""
        handles = self.submit(prompt, max_new_tokens, **kwargs)
        single = isinstance(handles, RequestHandle)
        handles = [handles] if single else handles
        try:
            results = await asyncio.gather(*(asyncio.wrap_future(h.future) for h in handles))
        except BaseException:
            for h in handles:
                h.cancel()
            raise
        return results[0] if single else list(results)

    async def achat(self, messages: Messages | Sequence[Messages], max_new_tokens: int = 64, **kwargs: Any) -> Any:
        return await self.agenerate(self._render(messages), max_new_tokens, **kwargs)

    async def stream(self, prompt: Prompt | Messages, max_new_tokens: int = 64, **kwargs: Any) -> AsyncIterator[str]:
        """Text deltas as tokens are generated (`prompt` may be chat messages). Their concatenation is the
        result's text: stop tokens are not shown, and text that could begin a stop string is held back. A request
        that is refused (say a prompt larger than the pool) or fails raises its error here, as does a loop thread
        that died."""
        if _is_messages(prompt):
            prompt = self._render(prompt)  # type: ignore[arg-type]
        req = self._request(prompt, max_new_tokens, **kwargs)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[tuple[int, ...], bool]] = asyncio.Queue()
        sent = 0

        def listener(r: Request) -> None:  # on the engine loop thread
            nonlocal sent
            new = tuple(r.output_ids[sent:])
            sent = len(r.output_ids)
            loop.call_soon_threadsafe(queue.put_nowait, (new, r.finished or r.error is not None))

        req.listener = listener
        params = req.sampler.params
        hidden = stop_token_set(params, self.eos_token_ids)
        holdback = max((len(s) for s in params.stop), default=1) - 1
        detok = self.output.detokenizer(req.prompt_ids)
        handle = self._enqueue([req])[0]
        # The future also ends when no listener call ever comes (a refused request, a dead loop): wake the reader.
        handle.future.add_done_callback(lambda _: _call_soon(loop, queue.put_nowait, ((), True)))
        emitted = ""
        try:
            while True:
                tokens, done = await queue.get()
                if done:  # the rest comes from the result's text (cut at a stop string); an error raises here
                    break
                for t in tokens:
                    if t not in hidden:
                        detok.add(t)
                visible = detok.text[: len(detok.text) - holdback] if holdback else detok.text
                if len(visible) > len(emitted):
                    yield visible[len(emitted) :]
                    emitted = visible
            result = await asyncio.wrap_future(handle.future)
            if result.text.startswith(emitted) and len(result.text) > len(emitted):
                yield result.text[len(emitted) :]
        finally:
            # Also when this generator's task was cancelled: that cancels the future (so it reads as done)
            # but not the engine request. Cancelling a request that already left is a no-op.
            if not handle.done() or handle.future.cancelled():
                handle.cancel()

    # ------------------------------------------------------------------ private

    def _make_mirror(self, memory: str | int | None) -> DecodeMirror | None:
        if memory is None:
            memory = DEFAULT_MIRROR_MEMORY if self.model.device.type == "cpu" else 0
        if memory == 0 or memory == "0":
            return None
        budget = parse_memory(memory)
        return DecodeMirror(self.config, self.model.dtype, self.model.device, budget, native=self.model.native)

    def _request(
        self,
        prompt: Prompt,
        max_new_tokens: int = 64,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        namespace: Hashable = None,
        params: SamplingParams | None = None,
        return_logits: bool = False,
        priority: int = 0,
        timeout: float | None = None,
        pin: bool | int = False,
        retention: int = 0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        min_p: float = 0.0,
        logit_bias: dict[int, float] | Sequence[tuple[int, float]] | None = None,
        logprobs: int | None = None,
        retain: str | None = None,
        session: str | None = None,
    ) -> Request:
        """A validated Request (generate's arguments); raises ValueError before anything is queued."""
        if self._closed:
            raise EngineClosedError("this engine is closed")
        t0 = time.perf_counter()
        if params is None:
            params = SamplingParams(
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                seed=seed,
                stop=(stop,) if isinstance(stop, str) else tuple(stop),
                stop_token_ids=tuple(stop_token_ids),
                ignore_eos=ignore_eos,
                presence_penalty=presence_penalty,
                frequency_penalty=frequency_penalty,
                repetition_penalty=repetition_penalty,
                min_p=min_p,
                logit_bias=logit_bias or (),  # type: ignore[arg-type]  # normalised to sorted pairs
                logprobs=logprobs,
            )
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        if params.logit_bias and (top := params.logit_bias[-1][0]) >= self.config.vocab_size:  # sorted: largest last
            raise ValueError(f"logit_bias token id {top} is outside the vocabulary [0, {self.config.vocab_size})")
        _check_namespace(namespace)
        check_retain(retain)
        ids = self._encode(prompt)
        pin_tokens = len(ids) if pin is True else int(pin)
        if pin_tokens and pin_tokens // self.cache.page_size > self.max_pinned_blocks:
            raise ValueError(
                f"pinning {pin_tokens} tokens exceeds the pinned share of the pool ({self.max_pinned_blocks} pages)"
            )
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        return Request(
            ids,
            params,
            Sampler(params, self.model.device),
            namespace=namespace,
            keep_logits=return_logits,
            t_arrival=t0,
            priority=priority,
            deadline=None if timeout is None else t0 + timeout,
            pin=pin_tokens,
            retention=retention,
            retain=retain,
            session=session,
        )

    def _submit_group(self, reqs: list[Request]) -> list[RequestHandle]:
        if not reqs:
            return []
        first = reqs[0].prompt_ids
        common = min(len(r.prompt_ids) for r in reqs)
        for r in reqs[1:]:
            common = next((i for i in range(common) if r.prompt_ids[i] != first[i]), common)
        one_namespace = len({r.namespace for r in reqs}) == 1

        def cap_at_what_is_cached(_: Scheduler) -> None:  # on the loop thread, just before they are added
            before = self.kv.peek(first[:common], reqs[0].namespace)[0] if one_namespace else 0
            for r in reqs:
                r.cached_cap = before  # admission reports min(its match, this)

        return self._enqueue(reqs, cap_at_what_is_cached)

    def _enqueue(self, reqs: list[Request], prepare: Any = None) -> list[RequestHandle]:
        """Hand prepared requests to the loop, all or none: QueueFullError (nothing queued) past `max_queue`."""
        if self.queue_timeout is not None:
            for r in reqs:
                r.queue_deadline = r.t_arrival + self.queue_timeout
        self.queue.enter(reqs)
        return self._loop.submit_many(reqs, prepare)

    def _check_vocabulary(self, ids: Sequence[int]) -> None:
        bad = next((t for t in ids if not 0 <= t < self.config.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")

    def _encode_continuation(self, text_or_ids: Prompt) -> list[int]:
        """A fork continuation's ids: text is encoded without special tokens, so no BOS lands mid-sequence."""
        if isinstance(text_or_ids, str):
            if self.tokenizer is None:
                raise ValueError("a text continuation needs a tokenizer; pass token ids instead")
            try:
                ids = list(self.tokenizer.encode(text_or_ids, add_special_tokens=False))
            except TypeError:  # a tokenizer without the keyword: drop a leading BOS it added
                ids = list(self.tokenizer.encode(text_or_ids))
                bos = getattr(self.tokenizer, "bos_token_id", None)
                if ids[:1] == [bos]:
                    ids = ids[1:]
        else:
            ids = [int(t) for t in text_or_ids]
        self._check_vocabulary(ids)
        return ids

    def _wait(self, handles: list[RequestHandle]) -> list[GenerationResult]:
        try:
            return [h.result() for h in handles]
        except BaseException:
            for h in handles:
                if not h.done():
                    h.cancel()
            raise

    @staticmethod
    def _split_batch(prompt: Any) -> tuple[list[Any], bool]:
        """(prompts, single): a str or a sequence of ints is one prompt; a list of those is a batch."""
        if isinstance(prompt, (str, torch.Tensor)):
            return [prompt], True
        items = list(prompt)
        if not items or all(isinstance(t, Integral) for t in items):
            return [items], True
        return items, False

    def _render(self, messages: Messages | Sequence[Messages]) -> Any:
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer; this engine has none")
        if _is_messages(messages):
            return self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)
        return [self.tokenizer.apply_chat_template(list(m), add_generation_prompt=True) for m in messages]

    def _encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass token ids instead")
            ids = list(self.tokenizer.encode(prompt))
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) >= self.config.max_position:
            raise ValueError(
                f"prompt of {len(ids)} tokens leaves no room under the model's max_position {self.config.max_position}"
            )
        self._check_vocabulary(ids)
        return ids


def _weights_identity(model: Any) -> str:
    """What names the weights in the disk tier's fingerprint: a digest of the file or directory they come from, or
    of the weights themselves when they were built in code."""
    if isinstance(model, (str, os.PathLike)):
        from radixcache.runtime.loading import resolve_model_path

        return "file:" + file_digest(resolve_model_path(model))
    if isinstance(model, LlamaModel) and model.weights_id:
        return model.weights_id
    source = getattr(model, "source", None)
    if isinstance(source, str) and os.path.exists(source):
        return "file:" + file_digest(source)
    weights = getattr(model, "weights", None)
    if isinstance(weights, dict) and weights:
        return "tensors:" + weights_digest(weights)
    raise ValueError(
        "cache_dir needs to fingerprint the weights: pass a model path or a loaded model (with .source or .weights), "
        "not a bare LlamaModel"
    )


def _is_messages(x: Any) -> bool:
    """A chat conversation: a non-empty sequence of dicts."""
    return not isinstance(x, str) and isinstance(x, Sequence) and bool(x) and isinstance(x[0], dict)


def _check_namespace(namespace: Hashable) -> None:
    """A namespace keys the cache's roots: refuse an unhashable one before anything is queued."""
    try:
        hash(namespace)
    except TypeError:
        raise ValueError(f"namespace must be hashable, got {type(namespace).__name__}") from None


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    """`loop.call_soon_threadsafe` that ignores a loop already closed (the reader went away)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)
