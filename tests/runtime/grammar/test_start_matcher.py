"""Each request's matcher is a copy of the one its compiled grammar built at compile time: building one costs about
what the compile does (~17 ms for the calls of 20 tools), and a request whose grammar came from the cache built it
again. The copies are independent of each other and of the start; the cache's bound on the grammars' characters
bounds the memory those start matchers hold."""

from __future__ import annotations

import threading

import llguidance
import numpy as np
import pytest

from radixcache.runtime.grammar import GrammarCompiler, GrammarSpec, GrammarState, allocate_masks
from tests.runtime.grammar.schemas import ALL

SCHEMA = ALL["nested"]


class _Counting:
    """llguidance.LLMatcher, counting the matchers built (its static methods pass through)."""

    def __init__(self, real: type) -> None:
        self.real, self.built = real, 0

    def __call__(self, *args: object, **kw: object) -> object:
        self.built += 1
        return self.real(*args, **kw)

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)


def _mask(state: GrammarState) -> np.ndarray:
    return state.allowed_mask(allocate_masks(1, state.vocab.vocab_size)[0]).copy()


def test_requests_of_a_cached_grammar_build_no_matcher(tiny_compiler, monkeypatch) -> None:
    compiler = GrammarCompiler(tiny_compiler.vocab)
    counting = _Counting(llguidance.LLMatcher)
    monkeypatch.setattr(llguidance, "LLMatcher", counting)
    spec = GrammarSpec.json_schema(SCHEMA)
    states = [GrammarState(compiler.compile(spec)) for _ in range(4)]
    assert counting.built == 1 and compiler.misses == 1 and compiler.hits == 3
    assert all((_mask(s) == _mask(states[0])).all() for s in states)


def test_copies_are_independent_of_each_other_and_of_the_start(tiny_tokenizer, tiny_compiler) -> None:
    compiled = tiny_compiler.compile(GrammarSpec.regex("(ab|cd)e"))
    fresh = GrammarState(compiled)
    start = _mask(fresh)
    advanced = GrammarState(compiled)
    advanced.accept(tiny_tokenizer.encode("a")[0])
    assert not (_mask(advanced) == start).all()
    later = GrammarState(compiled)  # copied after another copy moved on: still at the start
    assert (_mask(later) == start).all() and (_mask(fresh) == start).all()
    done: list[GrammarState] = []
    threads = [threading.Thread(target=lambda: done.append(GrammarState(compiled))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == 8 and all((_mask(s) == start).all() for s in done)


@pytest.mark.parametrize("max_chars", [1000, 3000])  # each grammar ~100 characters
def test_the_cache_bounds_the_characters_of_its_grammars(tiny_compiler, max_chars: int) -> None:
    compiler = GrammarCompiler(tiny_compiler.vocab, max_entries=100, max_chars=max_chars)
    for i in range(40):
        last = compiler.compile(GrammarSpec.regex(f"x{i}[a-z]+"))
        assert compiler.chars <= max_chars or len(compiler) == 1  # the newest always stays
    assert 1 <= len(compiler) < 40 and compiler.compile(last.spec) is last


def test_one_huge_grammar_never_flushes_the_other_namespaces(tiny_compiler) -> None:
    """Kept, the newest entry always stays: one schema of more characters than the bound evicted every other
    namespace's grammars. One past an eighth of the bound is compiled for its request and not kept."""
    compiler = GrammarCompiler(tiny_compiler.vocab, max_chars=4000)
    small = [compiler.compile(GrammarSpec.regex(f"s{i}[a-z]+"), namespace="quiet") for i in range(4)]
    huge = GrammarSpec.json_schema({"enum": [f"value-{i}" for i in range(400)]})
    assert len(compiler.compile(huge, namespace="loud").grammar) > 4000
    assert [compiler.compile(s.spec, namespace="quiet") for s in small] == small
    assert compiler.compile(huge, namespace="loud") is not None and len(compiler) == 4
