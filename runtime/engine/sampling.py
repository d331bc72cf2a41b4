"""Sampling parameters and the per-request sampler: greedy, temperature, top-k, top-p, seed, stops."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request chooses its tokens and when it stops.

    temperature 0 means greedy (argmax). top_k 0 and top_p 1.0 disable those filters. seed makes sampling
    reproducible per request (its own torch.Generator; no global RNG is touched). Generation stops at
    max_new_tokens, at one of stop_token_ids (plus the model's EOS ids unless ignore_eos), or when the
    decoded text contains one of `stop` (the text is cut before it).
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the smallest set whose probability reaches top_p.

    logits `[..., vocab]` (already divided by the temperature). The most likely token always survives.
    """
    out = logits
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # probability mass strictly ahead of each token
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


class Sampler:
    """Chooses one request's tokens from its logits. Holds that request's RNG; nothing global."""

    def __init__(self, params: SamplingParams, device: str | torch.device = "cpu") -> None:
        self.params = params
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            if params.seed is not None:
                self.generator.manual_seed(params.seed)
            else:
                self.generator.seed()

    def sample(self, logits: torch.Tensor) -> int:
        """Next token id from `[vocab]` logits."""
        p = self.params
        if p.greedy:
            return int(torch.argmax(logits))
        scaled = filter_logits(logits.float() / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(scaled, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))


def stop_token_set(params: SamplingParams, eos_token_ids: Sequence[int]) -> frozenset[int]:
    """Token ids that end generation: the request's own plus the model's EOS ids (unless ignore_eos)."""
    ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        ids.update(eos_token_ids)
    return frozenset(ids)


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index where the earliest stop string starts in `text`, or None."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None
