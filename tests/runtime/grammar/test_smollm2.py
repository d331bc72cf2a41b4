"""Decoding under the grammar mask with SmolLM2's real tokenizer (49,152 tokens, loaded from its GGUF): random
walks give JSON that parses and validates for nested, enum and escaped-string schemas, json_object gives an object,
a regex's output fullmatches, and the chat template's special tokens (<|im_start|>, ...) are never allowed."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from radixcache.runtime.grammar import GrammarSpec, GrammarState, allocate_masks
from radixcache.runtime.grammar.masks import unpack_masks
from tests.runtime.grammar.conftest import TokenTable, token_table, walk
from tests.runtime.grammar.schemas import ALL

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("grammar_smollm2")]


@pytest.fixture(scope="module")
def table(smollm2_tokenizer, smollm2_compiler) -> TokenTable:
    return token_table(smollm2_tokenizer, smollm2_compiler.vocab)


@pytest.mark.parametrize("name", ["nested", "enums", "refs"])
def test_schema_walks_validate(smollm2_tokenizer, smollm2_compiler, table, name: str) -> None:
    compiled = smollm2_compiler.compile(GrammarSpec.json_schema(ALL[name]))
    for seed in range(2):
        ids = walk(GrammarState(compiled), table, seed)
        jsonschema.validate(json.loads(smollm2_tokenizer.decode(ids)), ALL[name])


def test_json_object_and_regex(smollm2_tokenizer, smollm2_compiler, table) -> None:
    obj = smollm2_compiler.compile(GrammarSpec.json_object())
    assert isinstance(json.loads(smollm2_tokenizer.decode(walk(GrammarState(obj), table, 0))), dict)
    pattern = r"[A-Z][a-z]{1,8} (is|was) [0-9]{1,3}\."
    rx = smollm2_compiler.compile(GrammarSpec.regex(pattern))
    for seed in range(2):
        assert re.fullmatch(pattern, smollm2_tokenizer.decode(walk(GrammarState(rx), table, seed, close_after=6)))


def test_special_tokens_never_allowed(smollm2_tokenizer, smollm2_compiler) -> None:
    state = GrammarState(smollm2_compiler.compile(GrammarSpec.regex(r"(.|\n){0,40}")))
    row = allocate_masks(1, state.vocab.vocab_size)
    state.allowed_mask(row[0])
    allowed = unpack_masks(row, state.vocab.vocab_size)[0].numpy()
    specials = [i for i, t in smollm2_tokenizer.backend.get_added_tokens_decoder().items() if t.special]
    eos = set(smollm2_tokenizer.eos_token_ids)
    assert specials and not any(allowed[i] for i in specials if i not in eos)
    assert all(allowed[i] for i in eos)  # the empty text matches: the grammar may end at once
    assert np.count_nonzero(allowed) > 40_000
