"""The Engine: the public face of one model, its paged KV pool and its radix cache, serving many requests at once.

The request life: tokenise; match the prompt less its last token; lock; allocate the remaining pages (evicting
if needed); prefill the rest in chunks, batched with other requests' chunks and the running decodes, committing
each chunk's full pages to the tree as they are computed; decode, committing pages as they fill; unlock; free the
unaligned tail page.

The parts, each in its own module: engine.engine_config (what the engine is built from, validated once),
engine.options (one request's options), engine.request_builder (prompts to validated requests), engine.scheduler
(what runs in each step), engine.runner (one forward pass per step), kv.manager (the only door to the tree),
engine.output (sampling, stops, text, results), engine.loop (the thread that owns them all), engine.streaming (the
asyncio side) and engine.stats. This class builds them and offers the sync, async and streaming APIs; callers on
any thread or event loop submit to the loop thread. Two layers of the class live apart: engine.submission (a call's
options, builds, queueing and waits) and engine.engine_upkeep (close, flush, pins, retention, recording, checks).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from radixcache import RadixCache
from radixcache.policy.admission import make_admission
from radixcache.runtime.cores import default_threads
from radixcache.runtime.engine.assembly import (
    activations_id,
    build_kernels,
    build_kv,
    build_mirror,
    build_model,
    pool_blocks,
)
from radixcache.runtime.engine.engine_config import DEFAULT_KV_MEMORY, EngineConfig
from radixcache.runtime.engine.engine_upkeep import EngineUpkeep
from radixcache.runtime.engine.errors import EngineClosedError
from radixcache.runtime.engine.exit_hook import stop_at_exit
from radixcache.runtime.engine.gc_heap import HeapTimer
from radixcache.runtime.engine.loop import EngineLoop, RequestHandle
from radixcache.runtime.engine.options import RequestOptions, check_each, check_group, each_options
from radixcache.runtime.engine.output import OutputProcessor
from radixcache.runtime.engine.queue_limit import QueueGate
from radixcache.runtime.engine.request import GenerationResult, Request
from radixcache.runtime.engine.request_builder import (
    MaxNew,
    Messages,
    Prompt,
    RequestBuilder,
    check_fork_seed,
    fork_count,
    group_prompts,
    is_messages,
    split_batch,
)
from radixcache.runtime.engine.runner import ModelRunner
from radixcache.runtime.engine.scheduler import Scheduler
from radixcache.runtime.engine.session import Session
from radixcache.runtime.engine.stats import EngineStats
from radixcache.runtime.engine.streaming import TextStream, request_deltas, submitted_results
from radixcache.runtime.engine.submission import Submission
from radixcache.runtime.engine.threads import ThreadController
from radixcache.runtime.kv.retention import RetentionPolicy
from radixcache.runtime.kv.tier.fingerprint import kv_fingerprint
from radixcache.runtime.weak import weak_method

__all__ = ["DEFAULT_KV_MEMORY", "Engine", "EngineConfig", "EngineStats", "RequestOptions"]


class Engine(EngineUpkeep, Submission):
    """Generate text with a Llama-family model whose KV prefixes are shared through a radix cache.

    `Engine(model, **options)`: `options` are EngineConfig's fields (runtime.engine.engine_config documents each:
    KV size, page size, eviction policy, scheduling, quantisation, threads, queue limits, the decode mirror, tiers,
    KV events, admission); `Engine(config=EngineConfig(...))` or `Engine.from_config(config)` takes them whole
    (a `model` or keyword options given beside it override its fields). The config is validated once, before any
    weights load; `engine_config` keeps it. A request that outgrows the pool while decoding ends with
    finish_reason "length" and the tokens it made. `flush()` waits for queued disk writes.

    Requests: `generate`, `chat`, `submit`, `submit_group`, `fork`, `agenerate`, `achat`, `stream` and sessions
    take RequestOptions' keyword arguments (sampling, stop, logprobs, namespace, priority, timeout, pin,
    retention, retain, session, retain_for, response_format, tools; runtime.engine.options), or `options=` a
    RequestOptions built once. Structured output and tool calls: docs/structured_output.md, docs/tool_calls.md.

    Thread-safe: every call submits to one engine loop thread that owns the cache and the pool.

    Assembled from layers on one object: this module holds the construction and the request calls; engine.submission
    (options, builds, the queue and the waits behind every call) and engine.engine_upkeep (close, flush, pins,
    retention, recording, checks and stats) the rest.
    """

    def __init__(self, model: Any = None, *, config: EngineConfig | None = None, **options: Any) -> None:
        if model is not None:
            options["model"] = model
        if config is not None and not isinstance(config, EngineConfig):  # a dict was an AttributeError ('replace')
            raise ValueError(f"config must be an EngineConfig (or None), got {type(config).__name__}")
        if config is None:
            config = EngineConfig.of("Engine", **options)
        elif options:
            config = config.replace("Engine", **options)
        self.engine_config = config
        self.retention = RetentionPolicy(config.policy)  # the eviction order, which a "reuse" admission learns from
        self.admission = make_admission(config.admission, eviction=self.retention)
        self.model, self.tokenizer, weights_id = build_model(config)
        self.config = self.model.config
        capacity_blocks = pool_blocks(config, self.model)
        self.max_pinned_blocks = int(capacity_blocks * config.max_pinned_fraction)
        self.cache = RadixCache(capacity_blocks, config.page_size, self.retention)
        self.pool = self.model.new_pool(capacity_blocks, config.page_size)
        self.fingerprint = kv_fingerprint(
            self.config, self.pool, weights=weights_id, quant=self.model.quant, activations=activations_id(self.model)
        )
        self.enable_cache = config.enable_cache
        self.tiers, self.events, self.kv = build_kv(
            config, self.cache, self.pool, self.fingerprint, self.retention, self.admission, self.max_pinned_blocks
        )
        self.mirror = build_mirror(config.mirror_memory, self.model)
        tok_eos = tuple(getattr(self.tokenizer, "eos_token_ids", ()) or ())
        self.eos_token_ids = tuple(dict.fromkeys((*self.config.eos_token_ids, *tok_eos)))
        self.output = OutputProcessor(self.tokenizer, self.eos_token_ids, self.config.max_position)
        self.runner = ModelRunner(self.model, self.pool, self.mirror)
        self.scheduler = Scheduler(self.runner, self.kv, self.output, config.scheduler())
        # The loop thread sets its own OpenMP count (not inherited); the controller lowers it on a busy machine.
        # Torch's default ignores a cgroup CPU quota: capped by it here (runtime.cores).
        self.threads = config.threads if config.threads is not None else default_threads(torch.get_num_threads())
        self.kernel_plan = build_kernels(config, self.model, self.threads)  # measured once per machine, then cached
        self.thread_control = ThreadController(self.threads, adaptive=config.thread_policy == "adaptive")
        self._heap = HeapTimer(config.freeze_gc)  # the heap frozen once the engine has run a while (gc_heap)
        self._loop = EngineLoop(self.scheduler, self.output.result, self.thread_control, self._heap.idle)
        # the freeze's collection waits for a quiet loop (gc_heap); held weakly: the loop holds the timer's `idle`
        self._heap.is_idle = weak_method(self._loop.idle, default=False)
        # An engine dropped without close() lets go of the frozen heap too, the moment reference counting frees it
        # (its parts hold no cycles back to it: runtime/weak.py); else the heap would stay frozen for good
        self._release_heap = weakref.finalize(self, self._heap.close)
        self.queue = QueueGate(config.max_queue)
        self.queue_timeout = config.queue_timeout
        self.tool_memory = self.output.tool_memory  # the text the model wrote for its calls, by call ids
        self._builder = RequestBuilder(
            self.tokenizer,
            self.config,
            config.page_size,
            self.max_pinned_blocks,
            self.model.device,
            stop_token_ids=self.eos_token_ids,
            tool_memory=self.tool_memory,
            capacity_blocks=capacity_blocks,  # a prompt past the whole pool: refused before its batch is queued
        )
        self._closed = False
        stop_at_exit(self, self._loop)  # still running at interpreter exit: closed first, within a bound (exit_hook)

    @classmethod
    def from_config(cls, config: EngineConfig) -> Engine:
        return cls(config=config)

    # ------------------------------------------------------------------ public API: sync

    def generate(self, prompt: Prompt | Sequence[Prompt], max_new_tokens: MaxNew = None, **kwargs: Any) -> Any:
        """Continue `prompt` (text, or token ids); a list of prompts runs them concurrently and returns a list.

        Keyword arguments: RequestOptions' (runtime.engine.options), checked before anything is queued: sampling
        (temperature, top_k, top_p, min_p, seed, stop, stop_token_ids, ignore_eos, presence_penalty,
        frequency_penalty, repetition_penalty, logit_bias, logprobs; or `params`, a whole SamplingParams, alone),
        namespace, return_logits, priority, timeout, pin (larger than `max_pinned_fraction` of the pool: a
        ValueError; past it with the other pins: the result's `pinned_tokens` is 0), retention, retain
        ("conversation": the tree adopts every page whatever the admission policy predicts), session (the
        `session_id` `record_trace` writes), retain_for (seconds to lease the pages once it ends: runtime.kv.leases;
        the result's `lease`), response_format (an OpenAI response_format dict) or grammar (a GrammarSpec): the
        output is constrained to it; tools, tool_choice, parallel_tool_calls (OpenAI's; the result's `tool_calls`).
        `options`: a RequestOptions built beforehand; keyword arguments beside it, max_new_tokens too, override its
        fields (max_new_tokens not given: the options' own, else 64).
        """
        opts = self._options(max_new_tokens, kwargs.pop("options", None), kwargs, "generate")  # errors name generate
        handles = self.submit(prompt, options=opts)
        if isinstance(handles, RequestHandle):
            return self._wait([handles])[0]
        return self._wait(handles)

    def chat(self, messages: Messages | Sequence[Messages], max_new_tokens: MaxNew = None, **kwargs: Any) -> Any:
        """Render `messages` (OpenAI's, agent histories included) with the model's chat template, the `tools=` in
        it, and generate. A list of conversations runs them concurrently and returns a list of results."""
        opts = self._options(max_new_tokens, kwargs.pop("options", None), kwargs, "chat")
        return self.generate(self._builder.render_for(messages, opts), options=opts)

    def run(self, req: Request) -> GenerationResult:
        """Take one prepared request through its whole life (once: a ValueError for one submitted before). On any
        error its blocks are freed and its lock dropped."""
        if self._closed:
            raise EngineClosedError("this engine is closed")
        self._builder.check_sampling(req.sampler.params.stop, (), req.sampler.params.stop_token_ids)
        return self._wait(self._enqueue([req]))[0]

    def submit(
        self,
        prompt: Prompt | Sequence[Prompt],
        max_new_tokens: MaxNew = None,
        *,
        options: RequestOptions | None = None,
        **kwargs: Any,
    ) -> Any:
        """Queue `prompt` (or a list of prompts) without waiting: a RequestHandle (or a list of them) with
        `.result(timeout)`, `.future` and `.cancel()`. Takes generate's keyword arguments."""
        opts = self._options(max_new_tokens, options, kwargs, "submit")
        prompts, single = split_batch(prompt)
        reqs = self._build(prompts, [opts] * len(prompts))  # all validated before any runs
        handles = self._enqueue(reqs)  # they reach the scheduler together, between two steps
        return handles[0] if single else handles

    def submit_group(
        self,
        prompts: Sequence[Prompt],
        max_new_tokens: MaxNew = None,
        *,
        each: Sequence[dict[str, Any]] | None = (),
        options: RequestOptions | None = None,
        **kwargs: Any,
    ) -> list[RequestHandle]:
        """Queue prompts that belong to one call (the n samples of one prompt, fork branches) without waiting.

        They are queued together, so the first to run computes their common prefix and the others wait for its
        pages (in-flight sharing) instead of computing it too. Each reports as `cached_tokens` at most what the tree
        held of its prompt when the call arrived: one sample's work for the others is not a cache hit.
        `each[i]`: keyword arguments for prompt i only (say its seed), over the shared ones (None: none).
        """
        prompts = group_prompts(prompts)
        check_group(len(prompts), "submit_group")
        check_each(each, len(prompts))
        opts = self._options(max_new_tokens, options, kwargs, "submit_group")
        mine = each_options(opts, each, "Engine.submit_group")  # errors name each[i] and the field
        return self._submit_group(self._build(prompts, mine or [opts] * len(prompts)))

    def fork(
        self,
        prefix: Prompt | Messages,
        n: int | None = None,
        max_new_tokens: MaxNew = None,
        *,
        continuations: Sequence[Prompt] | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> list[GenerationResult]:
        """Run `n` branches from one prefix (text, ids or chat messages) that share its KV: the branches are
        queued together, the first computes the prefix and the others wait for its pages (in-flight sharing),
        then lock them. Branches differ by `continuations` (text or ids appended to the prefix, encoded without a
        second BOS; `n`, 4 by default, then equals their number) and/or by seed (`seed + i`, also for the seed of
        `options=`; set a temperature).

        Each result's `cached_tokens` counts what was cached before the call: the prefix computed by one branch
        for the others is the call's own work, not a cache hit."""
        opts = self._options(max_new_tokens, kwargs.pop("options", None), kwargs, "fork")
        n = fork_count(n, continuations)
        # `options=`'s seed is offset per branch as the keyword is (else every branch is alike); checked here
        seed = opts.sampling.seed if seed is None else opts.updated(seed=seed).sampling.seed
        check_fork_seed(seed, n)
        text = self._builder.render_for(prefix, opts) if is_messages(prefix) else prefix  # type: ignore[arg-type]
        ids = self._builder.encode(text)
        build, cs = self._builder.encode_continuation, continuations
        tails = [[]] * n if cs is None else [build(c, f"continuations[{i}]") for i, c in enumerate(cs)]
        branches = [opts if seed is None else opts.updated(seed=seed + i) for i in range(n)]
        reqs = self._build([ids + t for t in tails], branches, tuple(ids), "continuations" if cs else "")  # pins: ids
        return self._wait(self._submit_group(reqs))

    def session(self, system: str | None = None, **defaults: Any) -> Session:
        """A multi-turn chat whose history (and so its KV) grows turn by turn: `s.send("hi")`."""
        return Session(self, system=system, **defaults)

    async def agenerate(self, prompt: Prompt | Sequence[Prompt], max_new_tokens: MaxNew = None, **kwargs: Any) -> Any:
        """`generate` for asyncio: awaits the engine loop without blocking the event loop (the prompt is tokenised
        and its grammar compiled on a worker thread: streaming.off_loop), so calls made together are queued in the
        order their builds end (docs/api.md). Cancelling the awaiting task cancels the request."""
        opts = self._options(max_new_tokens, kwargs.pop("options", None), kwargs, "agenerate")
        return await submitted_results(lambda: self.submit(prompt, options=opts))

    async def achat(self, messages: Messages | Sequence[Messages], max_new_tokens: MaxNew = None, **kwargs: Any) -> Any:
        opts = self._options(max_new_tokens, kwargs.pop("options", None), kwargs, "achat")
        return await submitted_results(lambda: self.submit(self._builder.render_for(messages, opts), options=opts))

    def stream(self, prompt: Prompt | Messages, max_new_tokens: MaxNew = None, **kwargs: Any) -> TextStream:
        """Text deltas as tokens are generated (`prompt` may be chat messages); engine.streaming.stream_text says
        what is shown and when. With `tools=` (tool_choice not "none"), OpenAI's delta dicts instead:
        `{"content": text}` and `{"tool_calls": [...]}` (engine.streaming.tool_deltas). A refused or failed request
        raises its error here. A TextStream: once it ends, its `result` and `finish_reason` say why ("cancelled"
        for a stream cut by `close()` or a cancel, "timeout" for one its `timeout` cut)."""

        def build() -> Request:  # at the first read, off the event loop: its errors raise there
            opts = self._options(max_new_tokens, kwargs.pop("options", None), kwargs, "stream")
            return self._builder.build(self._builder.render_for(prompt, opts) if is_messages(prompt) else prompt, opts)  # type: ignore[arg-type]

        return TextStream(lambda ended: request_deltas(build, self._enqueue, self.output, ended))

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
