"""Constrained decoding: JSON object / JSON schema / regex / EBNF grammars over a model's vocabulary (llguidance).

    vocab = build_vocab(tokenizer, vocab_size=model_vocab)
    compiler = GrammarCompiler(vocab)
    state = GrammarState(compiler.compile(GrammarSpec.from_response_format(body["response_format"])))
    masks, rows = fill_masks([state, None, ...], vocab.vocab_size); apply_masks(logits, masks, rows)
    ... sample ...; state.accept(token)

`masks` imports torch; the rest does not.
"""

from __future__ import annotations

from radixcache.runtime.grammar.compiler import CompiledGrammar, GrammarCompiler
from radixcache.runtime.grammar.errors import GrammarError
from radixcache.runtime.grammar.spec import GrammarSpec, canonical_json
from radixcache.runtime.grammar.state import GrammarState, allocate_masks, mask_words
from radixcache.runtime.grammar.vocab import GrammarVocab, build_vocab

__all__ = [
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarSpec",
    "GrammarState",
    "GrammarVocab",
    "allocate_masks",
    "build_vocab",
    "canonical_json",
    "mask_words",
]
