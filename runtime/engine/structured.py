"""Structured output in the engine: one grammar compiler per engine, a `GrammarState` per request made in the
caller's thread, and each pass's constrained rows masked before they are sampled.

- Compiling is off the loop: `RequestBuilder.build` (the caller's thread) compiles the request's `GrammarSpec`
  through the engine's one `GrammarCompiler` (an LRU keyed by the request's cache namespace and the spec's hash: a
  tenant never reuses, so never times, another's compile) and makes the request's `GrammarState`; an invalid spec
  raises `GrammarError` (a ValueError naming the schema path) before anything is queued. The vocabulary (every
  token's bytes, SmolLM2's ~0.4 s) is built once, on a thread started with the engine: built at the first grammar,
  it was that request's time to first token, and told a tenant whether another had sent a grammar before. Its
  token table comes from disk after the first start (grammar/vocab_cache.py), which halves that thread's CPU.
  Built lazily, an engine that never sees a grammar would save ~0.2 s of CPU, which no replay's wall time or TTFT
  showed against the noise (docs/structured_output.md, "Why the vocabulary is built at every start").
- On the loop, `constrain` fills the mask rows of the requests of a pass that have a grammar and sets their
  disallowed logits to -inf, on a copy of those rows; the other rows are passed on untouched, so a batch with no
  grammar pays one scan of the list. The masked rows are what the sampler sees first: logit bias, penalties,
  temperature and top-k/p/min-p come after (masking first or last gives the same distribution: -inf stays -inf),
  and logprobs and `return_logits` report the masked rows.
- A request whose mask cannot be computed (its matcher in error) fails alone; the others of the pass go on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from radixcache.runtime.cores import usable_cores
from radixcache.runtime.grammar import (
    GrammarCompiler,
    GrammarError,
    GrammarSpec,
    GrammarState,
    GrammarVocab,
    build_vocab,
)
from radixcache.runtime.grammar.masks import apply_masks, fill_masks, make_executor
from radixcache.runtime.grammar.state import allocate_masks
from radixcache.runtime.grammar.vocab_cache import cached_table

if TYPE_CHECKING:
    from radixcache.runtime.engine.request import Request

Rows = list[tuple["Request", torch.Tensor]]
PARALLEL_MASKS_FROM_CPUS = 8  # llguidance's thread pool costs more than it saves on a few shared cores


class EngineGrammars:
    """The grammar compiler of one engine's tokenizer and logits width (thread-safe). Its vocabulary is built at
    once on a thread of its own (SmolLM2's: ~0.4 s), so no request waits for more than what is left of it; the
    compiler is made from it at the first grammar (reading `max_entries` then)."""

    def __init__(
        self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int] = (), max_entries: int = 256
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self.max_entries = max_entries
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()
        self._vocab: GrammarVocab | BaseException | None = None  # the vocabulary, or why it could not be built
        self._built = threading.Event()
        if hasattr(tokenizer, "token_bytes"):
            threading.Thread(target=self._build_vocab, name="grammar-vocab", daemon=True).start()
        else:
            self._built.set()

    def _build_vocab(self) -> None:
        try:
            table = cached_table(self.tokenizer)  # from disk after the first start (vocab_cache.py)
            self._vocab = build_vocab(
                self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids, table=table
            )
        except BaseException as exc:  # raised to each request that needs it (a tokenizer without EOS, a Rust panic)
            self._vocab = exc
        finally:
            self._built.set()

    @property
    def compiler(self) -> GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                if not hasattr(self.tokenizer, "token_bytes"):
                    raise ValueError(
                        "structured output (response_format, a grammar, or a tool_choice that requires a call) needs "
                        "the model's tokenizer; this engine has none"
                    )
                self._built.wait()  # what is left of the build started with the engine
                vocab = self._vocab
                if not isinstance(vocab, GrammarVocab):  # failed, or (never expected) ended without a result
                    why = (str(vocab) or type(vocab).__name__) if vocab is not None else "its build ended without one"
                    raise ValueError(f"structured output needs a grammar vocabulary: {why}") from vocab
                self._compiler = GrammarCompiler(vocab, self.max_entries)
            return self._compiler

    def state(self, spec: GrammarSpec, namespace: Hashable = None, stop_token_ids: Sequence[int] = ()) -> GrammarState:
        """A fresh matcher for one request (compiled once per distinct spec and cache namespace); the request's own
        `stop_token_ids` end its output only where the grammar is complete, as EOS does."""
        return GrammarState(self.compiler.compile(spec, namespace), stop_token_ids)


class Masker:
    """Applies the grammar masks of a pass's rows; owns the mask thread pool where the machine has the cores (made
    at the first batch of grammars, released by `close`)."""

    def __init__(self) -> None:
        self._executor: Any = None
        self._parallel = usable_cores() >= PARALLEL_MASKS_FROM_CPUS  # not the host's count: a container's

    def close(self) -> None:
        """Release the mask thread pool (its threads end once nothing uses it; a later batch makes another)."""
        self._executor = None

    def constrain(self, done: Rows, fail: Callable[[Request, BaseException], None]) -> Rows:
        """`done` with every constrained row replaced by its masked copy. A request whose mask fails is passed to
        `fail` and left out; unconstrained rows are the same tensors, in the same order."""
        picked = [i for i, (r, _) in enumerate(done) if r.grammar is not None]
        if not picked:
            return done
        states: list[GrammarState] = [done[i][0].grammar for i in picked]  # type: ignore[misc]
        masks, bad = self._fill(states)
        rows = torch.stack([done[i][1] for i in picked])
        apply_masks(rows, masks, range(len(picked)))
        out = list(done)
        for j, i in enumerate(picked):
            out[i] = (done[i][0], rows[j])
        for j, exc in bad.items():
            fail(done[picked[j]][0], exc)
        gone = {picked[j] for j in bad}
        return [row for i, row in enumerate(out) if i not in gone] if gone else out

    def _fill(self, states: list[GrammarState]) -> tuple[Any, dict[int, BaseException]]:
        width = states[0].vocab.vocab_size
        executor = None
        if self._parallel and len(states) > 1:
            self._executor = self._executor or make_executor()
            executor = self._executor
        try:
            masks, _ = fill_masks(states, width, executor)
            bad: dict[int, BaseException] = {}
        except Exception:  # one matcher broke the batch call: row by row, so only its request fails
            masks, bad = allocate_masks(len(states), width), {}
            for j, s in enumerate(states):
                try:
                    s.allowed_mask(masks[j])
                except Exception as exc:
                    bad[j] = exc
        for j, s in enumerate(states):
            if j not in bad and (failure := s.error()) is not None:
                bad[j] = GrammarError(failure, s.compiled.spec.path)
        return masks, bad
