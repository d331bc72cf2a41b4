"""The Engine: a model, a paged KV pool and a radix cache, serving one request at a time.

The request life: tokenise; match the prompt less its last token; lock; allocate the remaining pages
(evicting if needed); prefill the suffix in chunks; decode, allocating a page whenever the tail page fills;
insert prompt + output; unlock; free the unaligned tail page. `_prefill` and `_decode` work on requests and
a list of requests, so that a scheduler can drive them step by step (continuous batching, next).
"""

from __future__ import annotations

import os
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from radixcache import CacheStats, RadixCache
from runtime.attention import build_decode_meta
from runtime.kv_manager import KVManager
from runtime.kv_pool import blocks_for_budget
from runtime.model import DEFAULT_CHUNK, LlamaModel
from runtime.request import GenerationResult, Request
from runtime.sampling import Sampler, SamplingParams, find_stop, stop_token_set

DEFAULT_KV_MEMORY = "512MiB"
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

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the cache / prompt tokens."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Engine:
    """Generate text with a Llama-family model whose KV prefixes are shared through a radix cache.

    model: "smollm2", a GGUF path or an HF directory (loaded with runtime.loading), an already-loaded object
    with `.config`, `.weights` (and `.tokenizer`), or a LlamaModel. KV size: `capacity_blocks` pages, else
    `kv_memory` bytes (e.g. "2GiB"), else 512 MiB. `enable_cache=False` runs the same engine with no reuse.
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
    ) -> None:
        torch_dtype = resolve_dtype(dtype)
        if isinstance(model, (str, os.PathLike)):
            from runtime.loading import load_model

            load_dtype = torch.float32 if torch_dtype == torch.float64 else torch_dtype  # float64: tests only
            model = load_model(str(model), dtype=load_dtype, device=device)
        if isinstance(model, LlamaModel):
            self.model = model
        else:
            self.model = LlamaModel(model.config, model.weights, dtype=torch_dtype, device=device)
            tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        self.tokenizer = tokenizer
        self.config = self.model.config
        if capacity_blocks is None:
            budget = kv_memory if kv_memory is not None else DEFAULT_KV_MEMORY
            capacity_blocks = blocks_for_budget(self.config, budget, page_size, self.model.dtype)
        self.cache = RadixCache(capacity_blocks, page_size, policy)
        self.pool = self.model.new_pool(capacity_blocks, page_size)
        self.kv = KVManager(self.cache, enable_cache=enable_cache)
        self.enable_cache = enable_cache
        self.prefill_chunk = prefill_chunk
        tok_eos = tuple(getattr(tokenizer, "eos_token_ids", ()) or ())
        self.eos_token_ids = tuple(dict.fromkeys((*self.config.eos_token_ids, *tok_eos)))
        self._totals = {"requests": 0, "prompt": 0, "cached": 0, "prefill": 0, "generated": 0}

    # ------------------------------------------------------------------ public API

    def generate(
        self,
        prompt: str | Sequence[int],
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
    ) -> GenerationResult:
        """Continue `prompt` (text, or token ids). `params` replaces the individual sampling arguments."""
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
            )
        ids = self._encode(prompt)
        req = Request(
            ids,
            params,
            Sampler(params, self.model.device),
            namespace=namespace,
            keep_logits=return_logits,
            t_arrival=t0,
        )
        return self.run(req)

    def chat(self, messages: Sequence[dict[str, str]], max_new_tokens: int = 64, **kwargs: Any) -> GenerationResult:
        """Render `messages` with the model's chat template (adding the assistant turn) and generate."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer; this engine has none")
        text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)
        return self.generate(text, max_new_tokens, **kwargs)

    def run(self, req: Request) -> GenerationResult:
        """Take one request through its whole life. On any error its blocks are freed and its lock dropped."""
        if req.sampler.params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        with torch.inference_mode():
            try:
                self.kv.admit(req)
                self._emit(req, self._prefill(req))
                while not req.finished:
                    self._emit(req, self._decode([req])[0])
                self.kv.release(req)
            except BaseException:
                self.kv.abort(req)
                raise
        req.t_finish = time.perf_counter()
        return self._result(req)

    @property
    def stats(self) -> EngineStats:
        c, t = self.cache, self._totals
        return EngineStats(
            requests=t["requests"],
            prompt_tokens=t["prompt"],
            cached_tokens=t["cached"],
            prefill_tokens=t["prefill"],
            generated_tokens=t["generated"],
            capacity_blocks=c.capacity_blocks,
            free_blocks=c.free_blocks,
            evictable_blocks=c.evictable_blocks,
            locked_blocks=c.locked_blocks,
            cache=c.stats,
        )

    def __repr__(self) -> str:
        return f"Engine(model={self.config.name!r}, cache={self.cache!r}, enable_cache={self.enable_cache})"

    # ------------------------------------------------------------------ steps (a scheduler drives these)

    def _prefill(self, req: Request) -> torch.Tensor:
        """Compute the prompt positions the cache lacked. Returns the last position's logits."""
        start = req.num_kv
        logits = self.model.prefill(
            req.prompt_ids[start:], start, req.block_table, self.pool, chunk_size=self.prefill_chunk
        )
        req.num_kv = len(req.prompt_ids)
        return logits

    def _decode(self, reqs: Sequence[Request]) -> torch.Tensor:
        """One decode step for each request: the K/V of its last token go in, logits `[B, vocab]` come out."""
        for r in reqs:
            self.kv.reserve(r, r.num_kv + 1)
        meta = build_decode_meta(
            [r.block_table for r in reqs], [r.num_kv + 1 for r in reqs], self.pool.page_size, self.model.device
        )
        logits = self.model.decode([r.output_ids[-1] for r in reqs], meta, self.pool)
        for r in reqs:
            r.num_kv += 1
        return logits

    def _emit(self, req: Request, logits: torch.Tensor) -> None:
        """Sample the next token from `logits` and decide whether the request is done."""
        params = req.sampler.params
        token = req.sampler.sample(logits)
        if req.keep_logits:
            req.logits.append(logits.detach().float().cpu())
        req.output_ids.append(token)
        if req.t_first_token is None:
            req.t_first_token = time.perf_counter()
        if token in stop_token_set(params, self.eos_token_ids):
            req.finish_reason = "stop"
        elif params.stop and (cut := find_stop(self._text(req.output_ids), params.stop)) is not None:
            req.finish_reason, req.stop_at = "stop", cut
        elif len(req.output_ids) >= params.max_new_tokens or len(req.all_ids) >= self.config.max_position:
            req.finish_reason = "length"

    # ------------------------------------------------------------------ private

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
        bad = next((t for t in ids if not 0 <= t < self.config.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")
        return ids

    def _text(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _result(self, req: Request) -> GenerationResult:
        out = req.output_ids
        shown = out[:-1] if req.finish_reason == "stop" and req.stop_at is None else out
        text = self._text(shown)
        if req.stop_at is not None:
            text = text[: req.stop_at]
        t = self._totals
        t["requests"] += 1
        t["prompt"] += len(req.prompt_ids)
        t["cached"] += req.cached_tokens
        t["prefill"] += req.prefill_tokens
        t["generated"] += len(out)
        assert req.t_first_token is not None and req.t_finish is not None
        return GenerationResult(
            text=text,
            token_ids=tuple(out),
            prompt_tokens=len(req.prompt_ids),
            cached_tokens=req.cached_tokens,
            prefill_tokens=req.prefill_tokens,
            ttft_s=req.t_first_token - req.t_arrival,
            latency_s=req.t_finish - req.t_arrival,
            finish_reason=req.finish_reason or "length",
            logits=torch.stack(req.logits) if req.keep_logits else None,
        )
