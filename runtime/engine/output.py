"""The output processor: turns logits into tokens, decides when a request is done, and builds its result.

It owns everything between the model's logits and the caller: sampling, stop tokens and stop strings, the
tokenizer's text, and the engine's running totals. The scheduler calls `emit` once per new token; the engine loop
calls `result` once per request that left.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from radixcache.runtime.engine.request import GenerationResult, Request, TokenLogprob
from radixcache.runtime.engine.sampling import find_stop, stop_token_set
from radixcache.runtime.engine.structured import Masker, Rows
from radixcache.runtime.engine.tool_calls import with_tool_calls
from radixcache.runtime.kv.leases import NO_LEASE
from radixcache.runtime.loading.detokenizer import IncrementalDetokenizer, text_after
from radixcache.runtime.tools import ToolCallMemory, tool_template_features
from radixcache.runtime.tools.call_tokens import call_token_ids


@dataclass(slots=True)
class Totals:
    """Engine totals since construction (mutated on the loop thread only)."""

    requests: int = 0
    prompt: int = 0
    cached: int = 0
    prefill: int = 0
    generated: int = 0
    recomputed: int = 0


def token_logprob(logits: torch.Tensor, token: int, k: int) -> TokenLogprob:
    """`token`'s log-probability in the raw distribution of `[vocab]` logits, and the top k `(id, logprob)` pairs
    (descending, ties by id ascending; fewer when fewer than k are finite, as under a grammar's mask). One host
    transfer; nothing of the row is kept."""
    lp = torch.log_softmax(logits.detach().float(), dim=-1)
    if k <= 0:
        return TokenLogprob(token, float(lp[token]), ())
    k = min(k, lp.shape[-1])
    kth = torch.topk(lp, k).values[-1]
    # every token tied with the k-th too, ascending ids; never a -inf one (a grammar's mask leaves fewer than k)
    cand = torch.nonzero((lp >= kth) & torch.isfinite(lp)).squeeze(-1)
    vals = lp[cand]
    order = torch.sort(vals, descending=True, stable=True).indices[:k]  # stable: ties keep ascending ids
    k = len(order)
    # one transfer: [chosen, ids..., logprobs...] (ids < 2**53 are exact in float64)
    packed = torch.cat([lp[token].view(1).double(), cand[order].double(), vals[order].double()]).tolist()
    ids, top_lp = packed[1 : k + 1], packed[k + 1 :]
    return TokenLogprob(token, packed[0], tuple((int(i), v) for i, v in zip(ids, top_lp, strict=True)))


def _cpu_argmax(row: torch.Tensor) -> int | None:
    """The first index of a float32 CPU row's maximum, or None when that maximum is not finite."""
    values = row.detach().numpy()
    best = int(values.argmax())
    return best if math.isfinite(values[best]) else None


def greedy_tokens(rows: list[torch.Tensor]) -> Iterator[int | None]:
    """The argmax of each `[vocab]` row: float32 CPU rows each by numpy's argmax, others by one batched argmax (one
    host transfer); None for a row whose maximum is not finite (a NaN row's argmax is the NaN), or for every row if
    the argmax fails as a whole: that row's own sampler decides then, and refuses non-finite logits (SamplingError)
    for its request alone."""
    if not rows:
        return iter(())
    try:
        if all(r.device.type == "cpu" and r.dtype == torch.float32 and r.dim() == 1 for r in rows):
            # numpy's argmax: 5 us over SmolLM2's 49,152 logits where torch's takes 43 (the step's batched path
            # about 0.26 ms against 0.09 in the Engine); the same first index of the maximum, a NaN counting as one
            return iter([_cpu_argmax(r) for r in rows])
        batch = torch.stack(rows)
        best = batch.argmax(dim=-1)
        finite = torch.isfinite(batch.gather(1, best[:, None]).squeeze(1))
        picked = torch.where(finite, best, -1).tolist()
    except Exception:
        picked = [-1] * len(rows)
    return iter([t if t >= 0 else None for t in picked])


def pass_tokens(done: Sequence[tuple[Request, torch.Tensor]], greedy: Mapping[int, int | None]) -> list[int | None]:
    """The token each (request, logits row) of a pass takes without its sampler, or None where the sampler decides.
    Plain-greedy rows (no logit bias, no penalty: `plain_greedy`) take the token the pass found (`greedy`, by id of
    request: the native head's argmax of the same row) unless a grammar masked the row, else one argmax over all
    such rows (`greedy_tokens`, one host transfer). Every other row, greedy ones with a bias or penalty included,
    gets None."""
    plain = [r.sampler.params.plain_greedy for r, _ in done]
    known = [g and r.grammar is None and id(r) in greedy for (r, _), g in zip(done, plain, strict=True)]
    picked = greedy_tokens([row for (_, row), g, k in zip(done, plain, known, strict=True) if g and not k])
    rows = zip(done, plain, known, strict=True)
    return [greedy[id(r)] if k else next(picked) if g else None for (r, _), g, k in rows]


class OutputProcessor:
    """Sampling, stop detection, detokenisation and results for one engine."""

    def __init__(self, tokenizer: Any, eos_token_ids: Sequence[int], max_position: int) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.max_position = max_position
        self.totals = Totals()
        self.masker = Masker()
        self.tool_memory = ToolCallMemory()  # the text the model wrote for its calls (engine.tool_calls)
        self.tool_features = tool_template_features(tokenizer)  # of its "tool_use" template, where it has one
        self.call_tokens = call_token_ids(tokenizer, self.tool_features.format)  # special tokens calls are read from

    def constrain(self, done: Rows, fail: Callable[[Request, BaseException], None]) -> Rows:
        """A pass's rows with the grammar masks of the requests that have one (engine.structured)."""
        return self.masker.constrain(done, fail)

    def emit(self, req: Request, logits: torch.Tensor, token: int | None = None) -> None:
        """Sample the request's next token from `logits` (or take `token`, already chosen greedily for the whole
        batch), append it, and set `finish_reason` when the request is done."""
        params = req.sampler.params
        if token is None:
            token = req.sampler.sample(logits, req.prompt_ids, req.output_ids)
        complete = True  # the output before `token` (a stop string may cut it there)
        if req.grammar is not None:  # a token the mask did not allow raises GrammarError: this request fails
            complete = req.grammar.is_complete()
            req.grammar.accept(token)
        if req.keep_logits:
            req.logits.append(logits.detach().float().cpu())
        if params.logprobs is not None:  # of the raw logits: before bias, penalties and temperature
            req.logprobs.append(token_logprob(logits, token, params.logprobs))
        req.output_ids.append(token)
        if req.t_first_token is None:
            req.t_first_token = time.perf_counter()
        if token in stop_token_set(params, self.eos_token_ids) and (req.grammar is None or req.grammar.is_complete()):
            req.finish_reason = "stop"  # under a grammar, only where its output is complete (a stop token it names
            # as its text mid-sentence, a Lark grammar's <|im_end|>, is text)
        elif params.stop and (cut := self._find_stop(req, token, complete)) is not None:
            req.finish_reason, req.stop_at = "stop", cut
        elif req.grammar is not None and req.grammar.is_finished():  # only a stop token could follow
            req.finish_reason = "stop"
        elif len(req.output_ids) >= params.max_new_tokens or req.num_tokens >= self.max_position:
            req.finish_reason = "length"

    def _find_stop(self, req: Request, token: int, complete: bool) -> int | None:
        """Where the earliest stop string starts in the output's text, searching only the text `token` added and the
        longest stop's length before it (no stop ended earlier). Decoding the whole output at every token made a
        long reply with stop strings quadratic, on the engine's loop. Under a grammar, only a stop string that
        starts where the output was complete (`complete`: before `token`) ends it: one inside a JSON value cut it
        short, and finish_reason "stop" said it was whole; there it is the output's text. That point may lie inside
        a token's text (`_complete_at`): under `[a-z ]+` the stop "ith" of the token " with" cuts it to " w"."""
        if req.stop_text is None:
            req.stop_text = self.detokenizer(req.prompt_ids, self.kept(req))
        if req.grammar is not None:
            req.stop_cuts.append((req.stop_text.length, complete))
        added = req.stop_text.add(token)
        if not added:  # nothing new, or a character still incomplete
            return None
        # the output's text so far (a prefix of text(req.output_ids)), read only at its end
        stops = req.sampler.params.stop
        start = max(0, req.stop_text.length - len(added) - max(map(len, stops)) + 1)
        text = req.stop_text.since(start)
        if req.grammar is None:
            hit = find_stop(text, stops)
            return None if hit is None else start + hit
        cuts = req.stop_cuts
        first = next((i for i in range(len(cuts) - 1, -1, -1) if cuts[i][0] <= start), 0)
        while first > 0 and cuts[first - 1][0] == cuts[first][0]:
            first -= 1
        del cuts[:first]  # the tokens that start before this window's, but the one it starts in
        hits = sorted({start + i for s in stops for i in _occurrences(text, s)})
        return next((p for p in hits if self._complete_at(req, p)), None)

    def _complete_at(self, req: Request, at: int) -> bool:
        """Whether the output's text before character `at` is a sentence of the request's grammar: where a token
        starts (`stop_cuts`), as recorded; inside a token's text (a stop string " c" in the token " cat"), the grammar
        rolled back to that token's start on a copy, and fed the text up to `at`."""
        cuts = req.stop_cuts
        j = max((i for i, (offset, _) in enumerate(cuts) if offset <= at), default=None)
        if j is None or req.grammar is None:
            return False
        while j > 0 and cuts[j - 1][0] == cuts[j][0]:  # tokens that added no text yet (part of a character)
            j -= 1
        offset, complete = cuts[j]
        if offset == at:
            return complete
        assert req.stop_text is not None
        part = req.stop_text.since(offset)[: at - offset]
        ids = self.tokenizer.encode(part, add_special_tokens=False)
        return req.grammar.completes_after(len(cuts) - j, ids)

    def text(self, ids: Sequence[int], keep: frozenset[int] = frozenset()) -> str:
        """The text of `ids` without special tokens, but those in `keep` (`kept`)."""
        if self.tokenizer is None:
            return ""
        if keep:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True, keep=keep)
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def kept(self, req: Request) -> frozenset[int]:
        """The special tokens a request's text shows: its tool-call format's (runtime.tools.call_tokens) when its
        calls are parsed, so that they are parsed and remembered as the model wrote them; else none."""
        use = req.tool_use
        return self.call_tokens if use is not None and use.parses_calls else frozenset()

    def detokenizer(self, prompt_ids: Sequence[int] = (), keep: frozenset[int] = frozenset()) -> Any:
        """An incremental detokenizer for a stream of a request's output, decoded after its prompt's last tokens as
        `output_text` decodes the result's (runtime.loading.detokenizer), so the stream adds up to the result."""
        if hasattr(self.tokenizer, "detokenizer") and not keep:
            return self.tokenizer.detokenizer(prompt_ids)
        return IncrementalDetokenizer(lambda ids: self.text(ids, keep), prompt_ids)

    def output_text(self, prompt_ids: Sequence[int], ids: Sequence[int], keep: frozenset[int] = frozenset()) -> str:
        """The text `ids` add after the prompt: with a SentencePiece tokenizer (Llama 2, Mistral 7B) a first token
        "▁Paris" reads " Paris", as in vLLM (decoded alone, the decoder drops the space)."""
        if self.tokenizer is None:
            return ""
        return text_after(lambda ids: self.text(ids, keep), prompt_ids, ids)

    def result(self, req: Request) -> GenerationResult:
        """The caller's view of a request that left; also adds it to the totals (on the loop thread)."""
        out = req.output_ids
        text = self.raw_text(req)
        t = self.totals
        t.requests += 1
        admitted = req.t_admitted is not None
        if admitted:
            t.prompt += len(req.prompt_ids)
            t.cached += req.kv.cached_tokens
            t.prefill += req.prefill_tokens
        t.generated += len(out)
        t.recomputed += req.kv.recomputed_tokens
        t_finish = req.t_finish if req.t_finish is not None else time.perf_counter()
        t_first = req.t_first_token if req.t_first_token is not None else t_finish
        tpot = (t_finish - t_first) / (len(out) - 1) if len(out) > 1 else 0.0
        result = GenerationResult(
            text=text,
            token_ids=tuple(out),
            prompt_tokens=len(req.prompt_ids),
            cached_tokens=req.kv.cached_tokens,
            prefill_tokens=req.prefill_tokens if admitted else 0,
            ttft_s=t_first - req.t_arrival,
            latency_s=t_finish - req.t_arrival,
            finish_reason=req.finish_reason or "length",
            logits=torch.stack(req.logits) if req.keep_logits and req.logits else None,
            queue_s=(req.t_admitted if admitted else t_finish) - req.t_arrival,
            tpot_s=tpot,
            preemptions=req.kv.preemptions,
            recomputed_tokens=req.kv.recomputed_tokens,
            pinned_tokens=req.pinned_tokens,
            logprobs=tuple(req.logprobs) if req.sampler.params.logprobs is not None else None,
            lease=req.kv.lease or (NO_LEASE if req.kv.retain_for is not None else None),
            stop_at=req.stop_at,
            pinned_for=(req.pin_for or tuple(req.prompt_ids)) if req.pinned_tokens else (),  # what kv.pin named
        )
        use = req.tool_use
        if use is None or not use.parses_calls or req.call_ids is None or req.error is not None:
            return result
        memory = self.tool_memory.scoped(req.namespace)  # the calls are the request's namespace's own
        return with_tool_calls(result, use, self.tool_features, req.call_ids, memory, self._emitted_ids(req))

    def _emitted_ids(self, req: Request) -> tuple[int, ...]:
        """The ids the model emitted for its result's text: the output without the stop token that ended it; none
        when a stop string cut the text (its ids would not decode to it)."""
        if req.stop_at is not None:
            return ()
        out = req.output_ids
        return tuple(out[:-1] if self._ends_with_stop_token(req) else out)

    def raw_text(self, req: Request) -> str:
        """The text of a request's output: without the stop token that ended it, cut before a stop string (tool
        calls not yet parsed out; their format's special tokens shown when they are parsed: `kept`)."""
        out = req.output_ids
        text = self.output_text(req.prompt_ids, out[:-1] if self._ends_with_stop_token(req) else out, self.kept(req))
        return text if req.stop_at is None else text[: req.stop_at]

    def _ends_with_stop_token(self, req: Request) -> bool:
        """The last output token is the stop token that ended the request (not shown in the text); a grammar
        that finished stops on its last text token, which is shown even when it is one of the request's
        `stop_token_ids` (the closing `}` the grammar required: without it the output would be no JSON)."""
        if req.finish_reason != "stop" or req.stop_at is not None or not req.output_ids:
            return False
        if req.grammar is None or req.grammar.is_terminated():
            return True
        return req.output_ids[-1] in req.grammar.vocab.stop_ids  # an EOS the grammar names as its text


def _occurrences(text: str, stop: str) -> Iterator[int]:
    """Where `stop` starts in `text`, each place (overlapping ones too)."""
    at = text.find(stop)
    while at >= 0:
        yield at
        at = text.find(stop, at + 1)
