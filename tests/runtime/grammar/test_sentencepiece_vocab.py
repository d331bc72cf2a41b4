"""A SentencePiece tokenizer (Llama 2, Mistral 7B and TinyLlama ship tokenizer.json in this form: "▁" for a space,
byte fallback, a decoder that strips the text's leading space): each token's bytes keep their space, so the grammar
sees the text the model writes."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, normalizers

from radixcache.runtime.grammar import GrammarCompiler, GrammarSpec, GrammarState, allocate_masks, build_vocab
from radixcache.runtime.grammar.masks import unpack_masks
from radixcache.runtime.loading.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {"hello": {"type": "integer"}}, "required": ["hello"]}
PIECES = ["▁", "1", "2", "▁1", "▁2", "▁hello", "{", "▁{", "}"]


def sentencepiece_tokenizer() -> Tokenizer:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    vocab |= {p: len(vocab) + i for i, p in enumerate(p for p in PIECES if p not in vocab)}
    merges = [("▁", "1"), ("▁", "2"), ("▁", "{")]
    backend = Backend(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return Tokenizer(backend, eos_token_ids=(2,), bos_token_id=1, add_bos=True)


def test_sentencepiece_token_bytes_keep_their_space() -> None:
    """The decoded text of "▁1" alone is "1" (the decoder strips a leading space); its bytes are " 1"."""
    tok = sentencepiece_tokenizer()
    expected = {"▁": b" ", "1": b"1", "▁1": b" 1", "▁hello": b" hello", "▁{": b" {", "<0x0A>": b"\n"}
    assert {p: tok.token_bytes(tok.token_to_id(p)) for p in expected} == expected
    ids = tok.encode("1 2", add_special_tokens=False)
    assert b"".join(tok.token_bytes(i) for i in ids) == b" 1 2"  # the normalizer's "▁" before the text, then "1 2"


def test_a_grammar_never_takes_a_spaced_piece_for_a_digit() -> None:
    """An integer: after "1", "2" may follow and "▁2" (" 2") may not; it was allowed as "2", and the text the
    model wrote was "1 2", no integer."""
    tok = sentencepiece_tokenizer()
    vocab = build_vocab(tok)
    state = GrammarState(GrammarCompiler(vocab).compile(GrammarSpec.regex("[0-9]+")))
    state.accept(tok.token_to_id("1"))
    row = allocate_masks(1, vocab.vocab_size)
    state.allowed_mask(row[0])
    allowed = set(np.flatnonzero(unpack_masks(row, vocab.vocab_size)[0].numpy()).tolist())
    assert tok.token_to_id("2") in allowed and tok.token_to_id("▁2") not in allowed


@pytest.mark.parametrize(
    "spec",
    [
        GrammarSpec.json_object(),
        GrammarSpec.json_schema(SCHEMA),
        GrammarSpec.regex("1 2|hello"),
        GrammarSpec.ebnf('start: "{" " hello" "}"'),
    ],
    ids=lambda s: s.kind,
)
def test_every_token_a_grammar_allows_is_accepted(spec: GrammarSpec) -> None:
    """Text a grammar forces (a JSON object's `{`) was tokenized by the tokenizer, which puts a "▁" before what it
    encodes: the mask allowed "▁{" (or "▁") at the start, the grammar refused it, and every request under a grammar
    failed at once with a Llama 2 / Mistral 7B tokenizer.json. Random walks under the mask: each token is accepted,
    and the text parses (JSON) or matches."""
    tok = sentencepiece_tokenizer()
    vocab = build_vocab(tok)
    compiled = GrammarCompiler(vocab).compile(spec)
    for seed in range(10):
        rng, state, out = random.Random(seed), GrammarState(compiled), []
        while not state.is_finished() and len(out) < 40:
            row = allocate_masks(1, vocab.vocab_size)
            state.allowed_mask(row[0])
            allowed = np.flatnonzero(unpack_masks(row, vocab.vocab_size)[0].numpy()).tolist()
            if state.is_complete() and rng.random() < 0.3:
                break
            token = rng.choice([t for t in allowed if t not in vocab.stop_ids] or allowed)
            state.accept(token)
            out.append(token)
        text = b"".join(tok.token_bytes(t) for t in out).decode("utf-8", "replace")  # cut short: maybe mid-character
        if spec.kind == "regex":
            assert re.fullmatch(spec.source, text), text
        elif spec.kind == "ebnf":
            assert text == "{ hello}"
        elif state.is_complete():
            assert isinstance(json.loads(text), dict), text
