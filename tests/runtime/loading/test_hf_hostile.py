"""Hostile Hugging Face directories: config.json (and the other JSON files beside it) broken, of the wrong shape,
or with fields of the wrong type or out of range. Each is refused with a ValueError that starts with the file."""

from __future__ import annotations

import json
import re

import pytest

from radixcache.runtime.loading import load_model
from tests.runtime.loading.test_hf import hf_config, write_checkpoint


@pytest.fixture(scope="module")
def checkpoint(kit, tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf") / "llama"
    write_checkpoint(kit, directory, hf_config(kit))
    return directory


def linked_copy(checkpoint, directory, without: str):
    """`checkpoint`'s files linked into `directory`, but for `without` (which the test writes)."""
    directory.mkdir()
    for f in checkpoint.iterdir():
        if f.name != without:
            (directory / f.name).symlink_to(f)
    return directory


def refused(path, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        load_model(path.parent)
    assert str(caught.value).startswith(f"{path}: "), caught.value


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": None}, "hidden_size is missing"),
        ({"hidden_size": "x"}, "hidden_size is 'x', not an integer"),
        ({"hidden_size": 32.5}, "hidden_size is 32.5, not an integer"),
        ({"num_attention_heads": 0}, "num_attention_heads is 0, expected at least 1"),
        ({"num_attention_heads": -4}, "num_attention_heads is -4, expected at least 1"),
        ({"num_key_value_heads": 0}, "num_key_value_heads is 0, expected at least 1"),
        ({"num_key_value_heads": 3}, "4 attention heads are not a multiple of 3 KV heads"),
        ({"head_dim": 7}, "head_dim 7 is odd"),
        ({"vocab_size": 0}, "vocab_size is 0, expected at least 1"),
        ({"rope_scaling": "linear"}, "rope_scaling 'linear' is not supported"),
        ({"rope_theta": "x"}, "rope_theta is 'x', expected a finite number above 0"),
        ({"rms_norm_eps": -1}, "rms_norm_eps is -1, expected a finite number above 0"),
        ({"model_type": "mistral", "sliding_window": "x"}, "sliding_window is 'x', not an integer"),
        ({"eos_token_id": "x"}, "eos_token_id 'x' is not a token id or a list of them"),
        ({"eos_token_id": {"a": 1}}, "eos_token_id {'a': 1} is not a token id or a list of them"),
    ],
)
def test_config_fields_of_the_wrong_type_or_out_of_range_are_named(checkpoint, tmp_path, overrides, message):
    directory = linked_copy(checkpoint, tmp_path / "m", "config.json")
    cfg = json.loads((checkpoint / "config.json").read_text())
    cfg.update(overrides)
    (directory / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    refused(directory / "config.json", message)


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "generation_config.json"])
@pytest.mark.parametrize(("text", "message"), [("{bad", "not valid JSON"), ("[1, 2]", "expected a JSON object")])
def test_a_broken_json_file_is_named(checkpoint, tmp_path, name, text, message):
    directory = linked_copy(checkpoint, tmp_path / "m", name)
    (directory / name).write_text(text)
    refused(directory / name, message)
