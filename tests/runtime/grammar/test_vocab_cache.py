"""The grammar vocabulary's token table kept on disk (runtime/grammar/vocab_cache.py): a later start loads what the
first one read token by token, equal token for token; a file that is cut short, altered or another tokenizer's is
ignored and written again; a folder that cannot be written costs the cache, never the vocabulary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import radixcache.runtime.grammar.vocab_cache as vc
from radixcache.runtime.grammar import build_vocab
from radixcache.runtime.grammar.vocab import TokenTable, token_table


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(vc.ENV, str(tmp_path / "vocab"))
    return tmp_path / "vocab"


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The tokenizers whose table was read token by token (not loaded from a file)."""
    seen: list[Any] = []

    def counted(tokenizer: Any) -> TokenTable:
        seen.append(tokenizer)
        return token_table(tokenizer)

    monkeypatch.setattr(vc, "token_table", counted)
    return seen


def only_file(folder: Path) -> Path:
    files = list(folder.iterdir())
    assert len(files) == 1 and files[0].name.startswith("vocab-"), files
    return files[0]


@pytest.mark.parametrize("which", ["tiny_tokenizer", "smollm2_tokenizer"])
def test_a_later_start_loads_the_table_equal_to_a_fresh_read(
    which: str, folder: Path, reads: list[Any], request: pytest.FixtureRequest
) -> None:
    tokenizer = request.getfixturevalue(which)
    fresh = token_table(tokenizer)
    assert vc.cached_table(tokenizer) == fresh and len(reads) == 1  # read, and written
    only_file(folder)
    loaded = vc.cached_table(tokenizer)
    assert len(reads) == 1  # from the file this time
    assert loaded == fresh and len(loaded.plain) == tokenizer.vocab_size
    assert all(a == b and type(a) is bytes for a, b in zip(loaded.plain, fresh.plain, strict=True))
    # The vocabulary made from it is the same to llguidance: every token's bytes, which ones are special.
    a, b = build_vocab(tokenizer, table=loaded).lib, build_vocab(tokenizer).lib
    ids = range(tokenizer.vocab_size)
    assert [a.decode_bytes([i]) for i in ids] == [b.decode_bytes([i]) for i in ids]
    assert [a.is_special_token(i) for i in ids] == [b.is_special_token(i) for i in ids]


def test_the_key_is_the_tokenizers_definition(tiny_tokenizer: Any, smollm2_tokenizer: Any, folder: Path) -> None:
    from tokenizers import Tokenizer as Backend

    from radixcache.runtime.loading.tokenizer import Tokenizer

    again = Tokenizer(Backend.from_str(tiny_tokenizer.backend.to_str()))  # the same definition, another object
    assert vc.table_key(again) == vc.table_key(tiny_tokenizer)
    assert vc.table_key(tiny_tokenizer) != vc.table_key(smollm2_tokenizer)
    vc.cached_table(tiny_tokenizer)
    vc.cached_table(smollm2_tokenizer)
    assert len(list(folder.iterdir())) == 2


def _cut(data: bytes) -> bytes:
    return data[: len(data) - 7]


def _flip(data: bytes) -> bytes:
    return data[:-100] + bytes([data[-100] ^ 0x20]) + data[-99:]


def _special_out_of_range(data: bytes) -> bytes:
    head_end = data.index(b"\n", len(vc.MAGIC))
    head = json.loads(data[len(vc.MAGIC) : head_end])
    head["special"] = [10**6]
    return vc.MAGIC + json.dumps(head).encode() + data[head_end:]


@pytest.mark.parametrize(
    "damage",
    [
        _cut,
        _flip,
        _special_out_of_range,
        lambda d: b"",
        lambda d: b"\x00" * 64,
        lambda d: vc.MAGIC + b"{not json\n" + d[200:],
        lambda d: vc.MAGIC + b'{"key": 1}\n',
    ],
)
def test_a_corrupt_file_is_ignored_and_written_again(
    damage: Any, tiny_tokenizer: Any, folder: Path, reads: list[Any]
) -> None:
    fresh = vc.cached_table(tiny_tokenizer)
    path = only_file(folder)
    path.write_bytes(damage(path.read_bytes()))
    assert vc.cached_table(tiny_tokenizer) == fresh and len(reads) == 2  # read again
    assert vc.cached_table(tiny_tokenizer) == fresh and len(reads) == 2  # and the file is whole again
    assert only_file(folder) == path


def test_another_tokenizers_file_under_this_key_is_ignored(
    tiny_tokenizer: Any, smollm2_tokenizer: Any, folder: Path, reads: list[Any]
) -> None:
    fresh = vc.cached_table(tiny_tokenizer)
    path = only_file(folder)
    other = token_table(smollm2_tokenizer)
    path.write_bytes(vc.encode_table(other, vc.table_key(smollm2_tokenizer)))  # renamed onto this one's name
    assert vc.cached_table(tiny_tokenizer) == fresh and len(reads) == 2
    same_key_other_count = vc.encode_table(TokenTable(other.plain, ()), vc.table_key(tiny_tokenizer))
    path.write_bytes(same_key_other_count)
    assert vc.cached_table(tiny_tokenizer) == fresh and len(reads) == 3


def test_a_folder_that_cannot_be_written_costs_only_the_cache(
    tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads: list[Any]
) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(vc.ENV, str(blocker / "vocab"))  # mkdir fails (NotADirectoryError), as a read-only one would
    fresh = token_table(tiny_tokenizer)
    assert vc.cached_table(tiny_tokenizer) == fresh
    assert vc.cached_table(tiny_tokenizer) == fresh and len(reads) == 2  # read each time, never an error
    assert blocker.read_text() == "not a folder"


def test_off_keeps_no_file_and_no_home_names_no_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(vc.ENV, "off")
    assert vc.cache_dir() is None
    monkeypatch.delenv(vc.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert vc.cache_dir() == tmp_path / "radixcache" / "grammar"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/not/taken")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert vc.cache_dir() == tmp_path / "home" / ".cache" / "radixcache" / "grammar"
