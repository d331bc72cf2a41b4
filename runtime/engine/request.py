"""A request in flight (mutable, owned by the engine) and the frozen result handed back to the caller."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

from radixcache.runtime.engine.prefill_budget import StagedChunk
from radixcache.runtime.engine.sampling import Sampler, SamplingParams
from radixcache.runtime.kv.leases import LeaseGrant
from radixcache.runtime.kv.state import KVState
from radixcache.runtime.tools.messages import ToolCall
from radixcache.runtime.tools.use import CallIds, ToolUse

if TYPE_CHECKING:
    from radixcache.runtime.grammar import GrammarState
    from radixcache.runtime.loading.detokenizer import IncrementalDetokenizer


class TokenLogprob(NamedTuple):
    """One generated token's log-probability under the raw model distribution (log_softmax of the model's logits
    at that position, before logit bias, penalties and temperature), and the `top` k alternatives as
    `(token_id, logprob)`, by logprob descending, ties by token id ascending (k = SamplingParams.logprobs). Under a
    grammar, the distribution is the masked one: disallowed tokens are -inf, the rest renormalised over the allowed."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """What one request produced and what it cost.

    token_ids: generated ids (a final stop/EOS token included). text: their decoded text, without that stop
    token, cut before a stop string, special tokens skipped ("" without a tokenizer).
    cached_tokens: prompt tokens whose KV came from the cache. prefill_tokens: prompt tokens computed.
    ttft_s: request start to first token. latency_s: request start to the end.
    finish_reason: "stop" (EOS, stop token or stop string), "length" (max_new_tokens or max_position),
    "timeout" (its `timeout` passed) or "cancelled" (aborted by the caller); the last two keep what was generated.
    logits: `[len(token_ids), vocab]` float32 logits each token was chosen from, when asked for (tests).
    queue_s: arrival to first admission. tpot_s: mean time per output token after the first.
    preemptions: times the request was preempted under memory pressure. recomputed_tokens: positions computed
    again after a preemption (counted apart from cached_tokens and prefill_tokens).
    pinned_tokens: prompt tokens this request pinned (`pin=`); 0 when no pin was asked or the pin was refused
    (it would have exceeded the engine's pinned share of the pool). pinned_for: the prompt ids that pin was made
    for (`Engine.unpin(list(r.pinned_for), namespace=...)` releases exactly it, whatever a re-render of the prompt
    would give by then); () when nothing was pinned.
    logprobs: one TokenLogprob per entry of token_ids (its raw log-probability and the top k alternatives) when
    the request asked for them (`logprobs=k`), else None.
    lease: what `retain_for=` got (runtime.kv.leases.LeaseGrant: seconds and tokens held; both 0 when nothing was
    held: no cache, a cancel or failure, or nothing adopted), None when no lease was asked for.
    tool_calls: the calls parsed out of the output of a chat given `tools=` (runtime.tools.ToolCall: id, name,
    arguments JSON text); then finish_reason is "tool_calls" and `text` is the output outside the calls. Empty
    otherwise.
    stop_at: where a stop string cut the output's text (before tool calls were parsed out of it: their format's
    special tokens shown), None when none did. Under a grammar that is not the first place a stop string appears:
    only one where the output was complete ends it (runtime.engine.output).
    """

    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    ttft_s: float
    latency_s: float
    finish_reason: str
    logits: torch.Tensor | None = field(default=None, repr=False, compare=False)
    queue_s: float = 0.0
    tpot_s: float = 0.0
    preemptions: int = 0
    recomputed_tokens: int = 0
    pinned_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None
    lease: LeaseGrant | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    stop_at: int | None = None
    pinned_for: tuple[int, ...] = field(default=(), repr=False, compare=False)

    @property
    def decode_tps(self) -> float:
        """Generated tokens per second after the first."""
        n = len(self.token_ids) - 1
        return n / (self.latency_s - self.ttft_s) if n > 0 and self.latency_s > self.ttft_s else 0.0


_request_ids = itertools.count()


@dataclass(eq=False)
class Request:
    """One sequence's state from admission to release.

    Its KV (block table, locked node, page chain, status, cache accounting) is `kv`, a KVState that the KV manager
    owns and mutates (runtime.kv.state states its invariants); the request only holds it. A preempted request goes
    back to WAITING holding nothing; it resumes by prefilling `all_ids[:-1]` (mostly from the cache, where its own
    KV was inserted) and decoding on from its last token. `kv`'s fixed facts (namespace, sizes, pin, admission
    hint, arrival) are copied from the request's own fields once, when it is built.
    """

    prompt_ids: list[int]
    params: SamplingParams
    sampler: Sampler
    namespace: Hashable = None
    keep_logits: bool = False
    rid: int = field(default_factory=lambda: next(_request_ids))
    output_ids: list[int] = field(default_factory=list)
    kv: KVState = field(init=False, repr=False)  # built from the fields above (__post_init__)
    finish_reason: str | None = None
    stop_at: int | None = None  # cut the text here (a stop string was found)
    stop_text: IncrementalDetokenizer | None = field(default=None, repr=False)  # the output's text, with stop strings
    # under a grammar: where in that text each of the latest tokens starts, and whether the output was complete there
    # (a stop string may cut it only where it was complete: runtime.engine.output)
    stop_cuts: list[tuple[int, bool]] = field(default_factory=list, repr=False)
    logits: list[torch.Tensor] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output id when params.logprobs is set
    t_arrival: float = field(default_factory=time.perf_counter)
    t_first_token: float | None = None
    t_finish: float | None = None
    # scheduling
    priority: int = 0  # higher runs first and is preempted last
    deadline: float | None = None  # perf_counter time after which the request times out
    queue_deadline: float | None = None  # perf_counter time by which it must be admitted (QueueTimeoutError)
    on_dequeue: Callable[[], None] | None = field(default=None, repr=False)  # called once: admitted or gone
    pin: int = 0  # tokens of the prompt to pin in the cache once computed
    pinned_tokens: int = 0  # tokens the pin actually locked (0: no pin, or refused)
    pin_for: tuple[int, ...] | None = None  # the prompt `unpin` names for its pin (a fork's prefix; None: its own)
    pin_holder: str | None = None  # who holds its pin (RequestOptions.pin_holder; None: the caller at large)
    retention: int = 0  # retention priority of the prompt's KV (radixcache.runtime.kv.retention)
    retain: str | None = None  # admission hint: "conversation" (the next turn reads every page) or None
    t_admitted: float | None = None
    wait_steps: int = 0
    session: str | None = None  # the caller's conversation id (the `session_id` of a recorded trace line)
    retain_for: float | None = None  # seconds to lease its pages once it ends (radixcache.runtime.kv.leases)
    error: BaseException | None = None
    # structured output and tools: the matcher its tokens advance (None: unconstrained), its tools, its call ids
    grammar: GrammarState | None = field(default=None, repr=False)
    tool_use: ToolUse | None = field(default=None, repr=False)
    call_ids: CallIds | None = field(default=None, repr=False)
    listener: Callable[[Request], None] | None = field(default=None, repr=False)
    staged: StagedChunk | None = field(default=None, repr=False)  # a chunk between passes (engine.prefill_budget)

    def __post_init__(self) -> None:
        self.kv = KVState(
            rid=self.rid,
            namespace=self.namespace,
            prompt_tokens=len(self.prompt_ids),
            max_new_tokens=self.params.max_new_tokens,
            pin=self.pin,
            pin_holder=self.pin_holder,
            retain=self.retain,
            arrival_ms=self.t_arrival * 1000.0,  # ms, on the engine's perf_counter clock
            retain_for=self.retain_for,
        )

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefill_tokens(self) -> int:
        return len(self.prompt_ids) - self.kv.cached_tokens

    @property
    def prefill_end(self) -> int:
        """Positions whose K/V must exist before decoding: the prompt, or (resumed) every token but the last."""
        return len(self.prompt_ids) + len(self.output_ids) - 1 if self.output_ids else len(self.prompt_ids)


def dequeued(req: Request) -> None:
    """The request left the admission queue for good (first admitted, or left without ever being admitted): tell
    whoever counts the queue, exactly once."""
    callback, req.on_dequeue = req.on_dequeue, None
    if callback is not None:
        callback()


def check_unsubmitted(reqs: list[Request]) -> None:
    """A Request runs once: a ValueError for one already queued, running or gone. Queued again, one that had left
    never left again (it leaves once), so its caller waited for ever (`Engine.run` retried after an error)."""
    seen: set[int] = set()
    for req in reqs:
        if req.on_dequeue is not None or req.t_admitted is not None or req.t_finish is not None or req.rid in seen:
            raise ValueError(f"request {req.rid} was submitted already: a Request runs once; build a new one")
        seen.add(req.rid)
