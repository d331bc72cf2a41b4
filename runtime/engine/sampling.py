"""Sampling parameters and the per-request sampler: greedy, temperature, top-k, top-p, min-p, seed, stops, logit
bias, repetition / presence / frequency penalties."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields

import torch

from radixcache.runtime.engine.errors import SamplingError

MAX_LOGPROBS = 20  # the most alternatives `logprobs` may ask for per token (OpenAI's limit)
MAX_LOGIT_BIAS = 100.0  # |bias| limit (OpenAI's)
MAX_LOGIT_BIAS_ENTRIES = 1024  # token ids one logit_bias may name
GREEDY_BELOW = 1e-5  # a temperature below this is greedy (vLLM's and SGLang's threshold)
MAX_TEMPERATURE = 100.0
MIN_REPETITION_PENALTY = 0.01  # the repetition penalty multiplies or divides logits: bounded both ways
MAX_REPETITION_PENALTY = 100.0
MAX_STOP = 64  # stop strings per request
MAX_STOP_CHARS = 1024  # characters per stop string
MAX_STOP_TOKEN_IDS = 1024
MAX_SEED = 2**64 - 1  # seeds are in [-2**63, 2**64 - 1]: what a 64-bit generator seed takes, signed or not


def _real(name: str, value: object, lo: float, hi: float) -> float:
    """`value` as a finite float in [lo, hi], else a ValueError naming the field (a bool or a string is refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    x = float(value)
    if not (math.isfinite(x) and lo <= x <= hi):
        raise ValueError(f"{name} must be a finite number in [{lo:g}, {hi:g}], got {value!r}")
    return x


def _int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    """`value` as an int in [lo, hi], else a ValueError naming the field (a bool, a float or a string is refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def _token_id(t: object) -> int:
    """A logit_bias key as a token id: an int, or a decimal string (JSON object keys, as OpenAI clients send)."""
    if isinstance(t, bool):
        raise TypeError
    if isinstance(t, str):
        return int(t.strip())
    return operator.index(t)  # type: ignore[arg-type]


def _normalise_logit_bias(raw: object) -> tuple[tuple[int, float], ...]:
    """`{token: bias}` or `[(token, bias), ...]` as a tuple of `(token, bias)` sorted by token id, validated."""
    items: Iterable[object] = raw.items() if isinstance(raw, Mapping) else raw  # type: ignore[assignment]
    out: dict[int, float] = {}
    try:
        pairs = [tuple(p) for p in items]  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"logit_bias must map token ids to biases, got {raw!r}") from None
    for pair in pairs:
        if len(pair) != 2:
            raise ValueError(f"logit_bias entries must be (token_id, bias) pairs, got {pair!r}")
        key, value = pair
        try:
            tid = _token_id(key)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}") from None
        if tid < 0:
            raise ValueError(f"logit_bias token ids must be >= 0, got {tid}")
        if tid in out:
            raise ValueError(f"logit_bias names token id {tid} twice")
        if len(out) >= MAX_LOGIT_BIAS_ENTRIES:
            raise ValueError(f"logit_bias may name at most {MAX_LOGIT_BIAS_ENTRIES} token ids")
        try:
            bias = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"logit_bias[{tid}] must be a number, got {value!r}") from None
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:  # also refuses NaN
            raise ValueError(f"logit_bias[{tid}] must be in [-100, 100], got {value!r}")
        out[tid] = bias
    return tuple(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request chooses its tokens and when it stops.

    temperature 0 (or anything below GREEDY_BELOW, 1e-5) means greedy (argmax). top_k 0, top_p 1.0 and min_p 0.0
    disable those filters. seed makes sampling reproducible per request (its own torch.Generator; no global RNG is
    touched). Generation stops at max_new_tokens, at one of stop_token_ids (plus the model's EOS ids unless
    ignore_eos), or when the decoded text contains one of `stop` (the text is cut before it).

    The logits of each step are processed in this order (`Sampler.process`, then `Sampler.sample`):

    1. logit_bias: `bias` added to the logit of each `(token_id, bias)` (a dict is accepted; bias in [-100, 100]).
    2. repetition_penalty (vLLM / Hugging Face): for every token in the prompt or generated so far, a positive
       logit is divided by it and a negative one multiplied (> 0; 1.0 is off).
    3. presence_penalty and frequency_penalty (OpenAI): over the tokens generated so far (not the prompt),
       `logit[j] -= frequency_penalty * count[j] + presence_penalty * (count[j] > 0)` (each in [-2, 2]).
    4. temperature; greedy (0) takes the argmax of the logits processed so far, so bias and penalties apply to it.
    5. top_k, then top_p, then min_p (in [0, 1]: drop tokens whose probability is below min_p times the most
       likely token's; `filter_logits`).
    6. sample from the softmax of what is left.

    Checked here, each with a ValueError naming the field: every number is finite and of its type (a bool is not a
    number); temperature in [0, 100], repetition_penalty in [0.01, 100], top_p in (0, 1], min_p in [0, 1],
    presence/frequency penalties in [-2, 2], max_new_tokens >= 1, top_k >= 0, token ids >= 0; at most 64 stop
    strings of at most 1024 characters, 1024 stop_token_ids and 1024 logit_bias entries.

    None for any field is its default, as OpenAI's null is and as an agent framework's own `temperature=None` (or
    `stop=None`, `top_p=None`, ...) passed straight through means: max_new_tokens 64, temperature 0.0, top_k 0,
    top_p 1.0, min_p 0.0, the penalties 0.0 (repetition 1.0), ignore_eos False, and none for seed, stop,
    stop_token_ids, logit_bias and logprobs. If a request's logits go
    non-finite anyway (a model fault), `Sampler.sample` raises SamplingError for that request alone.

    logprobs: None returns none; k in [0, 20] returns, per generated token, its log-probability and the top k
    of the RAW model distribution (log_softmax of the model's logits, before any of the above; vLLM's default).
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    logprobs: int | None = None

    def __post_init__(self) -> None:
        # None is the field's default (OpenAI's null; a framework's own `temperature=None` passed through).
        for name, default in _NONE_IS_DEFAULT:
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        # Every value is checked for its type, finiteness and range here, at the door: a value that could make a
        # request's logits non-finite never reaches a step (the sampler still fails such a request alone).
        object.__setattr__(self, "max_new_tokens", _int("max_new_tokens", self.max_new_tokens, 1))
        _real("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        object.__setattr__(self, "top_k", _int("top_k", self.top_k, 0))
        _real("top_p", self.top_p, 0.0, 1.0)
        if self.top_p <= 0.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            object.__setattr__(self, "seed", _int("seed", self.seed, -(2**63), MAX_SEED))
        stop = (self.stop,) if isinstance(self.stop, str) else () if self.stop is None else self.stop
        try:
            stop = tuple(stop)
        except TypeError:
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}") from None
        if len(stop) > MAX_STOP or any(not isinstance(s, str) or not s or len(s) > MAX_STOP_CHARS for s in stop):
            raise ValueError(f"stop must be at most {MAX_STOP} non-empty strings of at most {MAX_STOP_CHARS} chars")
        object.__setattr__(self, "stop", stop)
        try:
            stop_ids = tuple(_int("stop_token_ids", t, 0) for t in self.stop_token_ids or ())
        except TypeError:
            raise ValueError(f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}") from None
        if len(stop_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, got {len(stop_ids)}")
        object.__setattr__(self, "stop_token_ids", stop_ids)
        if not isinstance(self.ignore_eos, bool):  # "no" read as true: a request that ran past its end of text
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            _real(name, getattr(self, name), -2.0, 2.0)
        _real("repetition_penalty", self.repetition_penalty, MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY)
        _real("min_p", self.min_p, 0.0, 1.0)
        object.__setattr__(self, "logit_bias", _normalise_logit_bias(self.logit_bias or ()))
        if self.logprobs is not None:
            k = self.logprobs
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_LOGPROBS:
                raise ValueError(f"logprobs must be None or an int in [0, {MAX_LOGPROBS}], got {k!r}")

    @property
    def greedy(self) -> bool:
        """Temperature below GREEDY_BELOW (1e-5) is greedy, as vLLM and SGLang treat it: dividing logits by less
        overflows float32."""
        return self.temperature < GREEDY_BELOW

    @property
    def uses_history(self) -> bool:
        """The penalties read the tokens seen so far (repetition: prompt and output; presence/frequency: output)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def processes_logits(self) -> bool:
        """Logit bias or a penalty changes the logits before temperature (else the sampler reads them as they are)."""
        return bool(self.logit_bias) or self.uses_history

    @property
    def plain_greedy(self) -> bool:
        """Greedy over the raw logits: the token is their argmax, which the scheduler takes for a whole batch."""
        return self.greedy and not self.processes_logits


# (name, default) of each field whose default is not None and not built by a factory (stop, stop_token_ids and
# logit_bias read None as none themselves): None given for it is that default.
_NONE_IS_DEFAULT = tuple(
    (f.name, f.default) for f in fields(SamplingParams) if f.default is not MISSING and f.default is not None
)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float, min_p: float = 0.0) -> torch.Tensor:
    """Set to -inf every logit outside the top-k, outside the smallest set whose probability reaches top_p, and
    (then) every one whose probability is below `min_p` times the largest.

    logits `[..., vocab]` (already divided by the temperature). The most likely token always survives. min_p
    compares ratios to the most likely token, which the earlier filters leave unchanged.
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
    if min_p > 0.0:
        probs = torch.softmax(out, dim=-1)
        out = out.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    return out


class Sampler:
    """Chooses one request's tokens from its logits. Holds that request's RNG and, when a penalty needs them,
    counts of the tokens it has seen; nothing global.

    The history is read from the request's `prompt_ids` and `output_ids` (append-only lists): the sampler counts
    only what was appended since its last call, so a step costs O(new tokens), not O(sequence).
    """

    def __init__(self, params: SamplingParams, device: str | torch.device = "cpu") -> None:
        self.params = params
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            if params.seed is not None:
                self.generator.manual_seed(params.seed)
            else:
                self.generator.seed()
        # Penalty state, built on the first `process` (it needs the vocabulary size and the logits' device).
        # Invariant: `_counts[j]` = occurrences of j in output_ids[:_n_output]; `_seen[j]` = j occurs in
        # prompt_ids[:_n_prompt] or in output_ids[:_n_output].
        self._counts: torch.Tensor | None = None
        self._seen: torch.Tensor | None = None
        self._n_prompt = 0
        self._n_output = 0
        self._bias: tuple[torch.Tensor, torch.Tensor] | None = None

    def sample(self, logits: torch.Tensor, prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()) -> int:
        """Next token id from `[vocab]` logits, given the request's prompt and the tokens generated so far (used by
        the penalties only)."""
        p = self.params
        if p.processes_logits:
            logits = self.process(logits, prompt_ids, output_ids)
        if p.greedy:
            token = int(torch.argmax(logits))
            best = float(logits[token])
            if not math.isfinite(best):  # a NaN wins an argmax too: no token can be chosen from these
                raise SamplingError(f"the logits went non-finite (largest {best})")
            return token
        scaled = filter_logits(logits.float() / p.temperature, p.top_k, p.top_p, p.min_p)
        probs = torch.softmax(scaled, dim=-1)
        total = float(probs.sum())
        if not math.isfinite(total) or total <= 0.0:  # NaN or +inf anywhere makes the sum non-finite
            raise SamplingError(f"the sampling probabilities went non-finite (sum {total})")
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def process(
        self, logits: torch.Tensor, prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()
    ) -> torch.Tensor:
        """`[vocab]` float32 logits after logit_bias, repetition penalty and presence/frequency penalties (steps 1-3
        of SamplingParams; before temperature). Returns `logits` itself when the params change nothing."""
        p = self.params
        if not p.processes_logits:
            return logits
        out = logits.float().clone()
        vocab = out.shape[-1]
        if p.logit_bias:
            if self._bias is None or self._bias[0].device != out.device:
                ids = [t for t, _ in p.logit_bias]
                if ids[-1] >= vocab:  # sorted: the last id is the largest
                    raise ValueError(f"logit_bias token id {ids[-1]} is outside the vocabulary [0, {vocab})")
                values = [b for _, b in p.logit_bias]
                self._bias = (
                    torch.tensor(ids, dtype=torch.long, device=out.device),
                    torch.tensor(values, dtype=torch.float32, device=out.device),
                )
            out.index_add_(0, self._bias[0], self._bias[1])
        if p.uses_history:
            counts, seen = self._history(prompt_ids, output_ids, vocab, out.device)
            if p.repetition_penalty != 1.0:
                penalised = torch.where(out > 0, out / p.repetition_penalty, out * p.repetition_penalty)
                out = torch.where(seen, penalised, out)
            if p.frequency_penalty != 0.0:
                out -= p.frequency_penalty * counts
            if p.presence_penalty != 0.0:
                out -= p.presence_penalty * (counts > 0).float()
        return out

    def _history(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], vocab: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The output counts and the seen-mask, brought up to date with what was appended since the last call."""
        if (
            self._counts is None
            or self._counts.shape[0] != vocab
            or self._counts.device != device
            or len(prompt_ids) != self._n_prompt  # another prompt (a reused sampler): count from scratch
            or len(output_ids) < self._n_output
        ):
            self._counts = torch.zeros(vocab, dtype=torch.float32, device=device)
            self._seen = torch.zeros(vocab, dtype=torch.bool, device=device)
            self._n_output = 0
            self._n_prompt = len(prompt_ids)
            if prompt_ids:
                self._seen[torch.as_tensor(list(prompt_ids), dtype=torch.long, device=device)] = True
        assert self._seen is not None
        if len(output_ids) > self._n_output:
            new = torch.as_tensor(list(output_ids[self._n_output :]), dtype=torch.long, device=device)
            self._counts.index_add_(0, new, torch.ones(len(new), dtype=torch.float32, device=device))
            self._seen[new] = True
            self._n_output = len(output_ids)
        return self._counts, self._seen


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
