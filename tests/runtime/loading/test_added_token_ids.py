"""An added token of tokenizer.json whose id is not the one the tokenizers library gives it: the library renumbers
it without a word (an id a vocabulary entry or another added token holds, an id past a gap), so `encode` gave the
model ids it was not trained on (`<tool>` declared 68 encoded as 258) and a decode of the declared id another
token's text (68: "e"). Refused at load, naming the file, the token and both ids; an added token that repeats a
vocabulary entry at its own id (Llama 2's `<s>`) still loads and round-trips."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime.loading.tokenizer import Tokenizer
from tests.cli.conftest import write_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("added_ids") / "tiny")


def _with_added(tiny: Path, where: Path, added: list[tuple[int, str]]) -> Path:
    shutil.copytree(tiny, where)
    spec = json.loads((tiny / "tokenizer.json").read_text(encoding="utf-8"))
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    spec["added_tokens"] += [{"id": i, "content": text, **flags} for i, text in added]
    (where / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return where


E = 68  # the tiny byte vocabulary's id of "e"; 256 and 257 are its ChatML tokens, 258 the next id


@pytest.mark.parametrize(
    ("added", "token", "declared", "given", "why"),
    [
        ([(E, "<tool>")], "<tool>", E, 258, "id 68 is the token 'e'"),
        ([(256, "<tool>")], "<tool>", 256, 258, "id 256 is the token '<|im_end|>'"),
        ([(258, "<x>"), (258, "<y>")], "<y>", 258, 259, "id 258 is the token '<x>'"),
        ([(1000, "<x>")], "<x>", 1000, 258, "it gives added tokens the ids after the vocabulary.s, in order"),
    ],
    ids=["a-vocabulary-id", "an-added-id", "two-on-one-id", "past-a-gap"],
)
def test_an_added_token_the_library_would_renumber_is_refused_naming_it(
    tiny: Path, tmp_path: Path, added: list[Any], token: str, declared: int, given: int, why: str
) -> None:
    directory = _with_added(tiny, tmp_path / "m", added)
    message = f"tokenizer.json: added token {token!r} says id {declared}, but the tokenizers library numbers it {given}"
    with pytest.raises(ValueError, match=f"{message} \\({why}"):
        Tokenizer.from_hf_dir(directory)


def test_an_added_token_repeating_a_vocabulary_entry_at_its_id_loads_and_round_trips(tiny: Path, tmp_path: Path):
    tokenizer = Tokenizer.from_hf_dir(_with_added(tiny, tmp_path / "m", [(E, "e"), (258, "<tool>")]))
    ids = tokenizer.encode("e<tool>e", add_special_tokens=False)
    assert ids == [E, 258, E]
    assert tokenizer.decode(ids, skip_special_tokens=False) == "e<tool>e"
