"""Hostile Hugging Face directories: config.json (and the other JSON files beside it) broken, of the wrong shape,
or with fields of the wrong type or out of range; safetensors files whose header lies, integer weights, a broken
tokenizer.json or shard index. Each is refused with a ValueError that starts with the file."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

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
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false, got 'false'"),
        ({"tie_word_embeddings": 0}, "tie_word_embeddings must be true or false, got 0"),
        # 400-digit integers (JSON reads them as Python ints): an OverflowError from the first float they met
        ({"rope_theta": 10**400}, "rope_theta is 1000"),
        ({"rms_norm_eps": 10**400}, "rms_norm_eps is 10000"),
        ({"max_position_embeddings": 10**400}, "max_position_embeddings is 10000000000000000000000000000000000000"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 10**400}}, "rope_scaling.factor is 1000"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 10**400}},
            "rope_scaling.original_max_position_embeddings is 1000000000000000000000000000000000000000..., past 2**63",
        ),
    ],
)
def test_config_fields_of_the_wrong_type_or_out_of_range_are_named(checkpoint, tmp_path, overrides, message):
    directory = linked_copy(checkpoint, tmp_path / "m", "config.json")
    cfg = json.loads((checkpoint / "config.json").read_text())
    cfg.update(overrides)
    (directory / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    refused(directory / "config.json", message)


def test_more_layers_than_the_weights_hold_is_named_before_listing_them(checkpoint, tmp_path):
    """num_hidden_layers 10**8 listed 10**9 expected weights (a MemoryError after a minute) before naming one."""
    directory = linked_copy(checkpoint, tmp_path / "m", "config.json")
    cfg = json.loads((checkpoint / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 10**5}))
    message = f"{directory}: weights do not match the config: it has 100000 layers, but there are only 21 weights"
    with pytest.raises(ValueError, match=re.escape(message)):
        load_model(directory)


def test_more_tokens_than_embedding_rows_is_refused(kit, tmp_path):
    """265 tokens over a 200-row embedding loaded, and then every prompt holding one of the last 65 tokens failed
    as 'outside the vocabulary' (a GGUF file like it is refused: test_gguf_hostile)."""
    write_checkpoint(kit, tmp_path / "short", hf_config(kit, vocab_size=200))
    message = f"{tmp_path / 'short' / 'tokenizer.json'}: token ids up to 264, but {tmp_path / 'short' / 'config.json'}"
    with pytest.raises(ValueError, match=re.escape(message + " has vocab_size 200")):
        load_model(tmp_path / "short")


def test_an_added_token_past_the_embedding_is_let_be(checkpoint, tmp_path):
    """A pad token added to the tokenizer without resizing the embedding (as some Llama 2 fine-tunes ship): the
    model runs on any prompt that does not hold it, as in transformers and vLLM; it was refused at load."""
    directory = linked_copy(checkpoint, tmp_path / "m", "tokenizer.json")
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    pad = {"id": 265, "content": "<pad>", "single_word": False, "lstrip": False, "rstrip": False}
    tokenizer["added_tokens"].append({**pad, "normalized": False, "special": True})
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    m = load_model(directory)
    assert m.tokenizer.token_to_id("<pad>") == 265 and m.config.vocab_size == 265
    assert max(m.tokenizer.encode("hello world")) < 265


def test_a_token_id_past_the_embedding_in_a_vocabulary_with_gaps_is_refused(checkpoint, tmp_path):
    """265 token ids with a gap, the last one 400, over 265 embedding rows: counted, the vocabulary fits."""
    directory = linked_copy(checkpoint, tmp_path / "m", "tokenizer.json")
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    assert tokenizer["model"]["vocab"]["Ġwor"] == 264
    tokenizer["model"]["vocab"]["Ġwor"] = 400
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    refused(directory / "tokenizer.json", "token ids up to 400, but")


@pytest.mark.parametrize("name", ["generation_config.json", "config.json"])
def test_an_eos_id_past_the_vocabulary_is_named(checkpoint, tmp_path, name):
    """eos_token_id 100000 of 265 tokens loaded; it could never be sampled, and a request with a response_format
    then failed with llguidance's 'EOS token ID 100000 is out of range'."""
    directory = linked_copy(checkpoint, tmp_path / "m", name)
    cfg = json.loads((checkpoint / "config.json").read_text()) if name == "config.json" else {}
    (directory / name).write_text(json.dumps({**cfg, "eos_token_id": [2, 100000]}))
    refused(directory / name, "eos_token_id 100000 is past the token ids of tokenizer.json (0 to 264)")


def test_add_bos_token_as_text_is_refused(checkpoint, tmp_path):
    """ "false" is true to bool(): every prompt got a BOS that tokenizer_config.json said not to add."""
    directory = linked_copy(checkpoint, tmp_path / "m", "tokenizer_config.json")
    config = {"bos_token": "<|endoftext|>", "add_bos_token": "false"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    refused(directory / "tokenizer_config.json", "add_bos_token must be true or false, got 'false'")


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "generation_config.json"])
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{bad", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # a RecursionError: the CLI's 'internal error'
    ],
    ids=["broken", "array", "deep"],
)
def test_a_broken_json_file_is_named(checkpoint, tmp_path, name, text, message):
    directory = linked_copy(checkpoint, tmp_path / "m", name)
    (directory / name).write_text(text)
    refused(directory / name, message)


def _header_lying_about_offsets(data: bytes) -> bytes:
    """The safetensors file with its first tensor's data said to end a terabyte past the file."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    first = min(k for k in header if k != "__metadata__")
    header[first]["data_offsets"] = [0, 10**12]
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + data[8 + size :]


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda data: (10**12).to_bytes(8, "little") + b"{}", "not a readable safetensors file"),
        (lambda data: data[:5000], "not a readable safetensors file"),
        (_header_lying_about_offsets, "not a readable safetensors file"),
    ],
)
def test_a_safetensors_file_whose_header_lies_is_named(checkpoint, tmp_path, corrupt, message):
    directory = linked_copy(checkpoint, tmp_path / "m", "model.safetensors")
    (directory / "model.safetensors").write_bytes(corrupt((checkpoint / "model.safetensors").read_bytes()))
    refused(directory / "model.safetensors", message)


def test_integer_weights_are_refused_not_cast_to_float(checkpoint, tmp_path):
    """int8 codes of a quantised checkpoint under a weight's name: cast to float they are not the weights."""
    directory = linked_copy(checkpoint, tmp_path / "m", "model.safetensors")
    weights = load_file(str(checkpoint / "model.safetensors"))
    weights["model.layers.0.mlp.up_proj.weight"] = torch.ones(64, 32, dtype=torch.int8)
    save_file(weights, str(directory / "model.safetensors"))
    refused(directory / "model.safetensors", "tensor model.layers.0.mlp.up_proj.weight is I8; only floating-point")


@pytest.mark.parametrize("text", ["{bad", "{}", '{"model": {"type": "BPE", "vocab": 5}}'])
def test_a_broken_tokenizer_json_is_named(checkpoint, tmp_path, text):
    directory = linked_copy(checkpoint, tmp_path / "m", "tokenizer.json")
    (directory / "tokenizer.json").write_text(text)
    refused(directory / "tokenizer.json", "not a tokenizer.json the tokenizers library can read")


@pytest.mark.parametrize("text", ["{bad", "{}", '{"weight_map": ["model.safetensors"]}'])
def test_a_broken_shard_index_is_named(checkpoint, tmp_path, text):
    directory = linked_copy(checkpoint, tmp_path / "m", "model.safetensors.index.json")
    (directory / "model.safetensors.index.json").write_text(text)
    refused(directory / "model.safetensors.index.json", "not valid JSON" if text == "{bad" else "weight_map is not")


@pytest.mark.parametrize("shard", ["../model.safetensors", "/etc/model.safetensors", "sub/model.safetensors", ".."])
def test_a_shard_outside_the_model_directory_is_refused(checkpoint, tmp_path, shard):
    """The shard index's file names were joined to the directory as given: "../x.safetensors" or an absolute path
    loaded another directory's weights."""
    directory = linked_copy(checkpoint, tmp_path / "m", "model.safetensors.index.json")
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": shard}}))
    refused(directory / "model.safetensors.index.json", f"shard {shard!r} is not a file name in the model directory")


@pytest.mark.parametrize("chat_template", [5, {"template": "x"}])  # bad lists: test_named_templates
def test_a_chat_template_that_is_not_text_is_named_at_load(checkpoint, tmp_path, chat_template):
    """Loaded as the template, it failed only when a chat request rendered it."""
    directory = linked_copy(checkpoint, tmp_path / "m", "tokenizer_config.json")
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": chat_template}))
    refused(directory / "tokenizer_config.json", "chat_template is ")


def test_a_chat_template_file_that_is_not_utf8_is_named(checkpoint, tmp_path):
    directory = linked_copy(checkpoint, tmp_path / "m", "chat_template.jinja")
    (directory / "chat_template.jinja").write_bytes(b"{{ messages }}\xff\xfe")
    refused(directory / "chat_template.jinja", "not UTF-8 text")


LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize 269060552\n".format("0" * 64)


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])
def test_a_git_lfs_pointer_in_place_of_a_file_is_named_as_one(checkpoint, tmp_path, name):
    """A clone without git-lfs leaves these: the error said 'header too large' or 'expected value at line 1'."""
    directory = linked_copy(checkpoint, tmp_path / "m", name)
    (directory / name).write_text(LFS_POINTER)
    refused(directory / name, "a Git LFS pointer, not the file itself")


def test_weights_that_do_not_fit_the_config_are_refused_before_their_data_is_read(checkpoint, tmp_path, monkeypatch):
    """A checkpoint of another size was read whole into float32 before its shapes were checked: a 7B model's
    beside a config.json of a small one took more memory than the machine had. Its headers are enough."""
    from radixcache.runtime.loading import hf

    directory = linked_copy(checkpoint, tmp_path / "m", "config.json")
    cfg = json.loads((checkpoint / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 128}))

    def no_data(path):
        raise AssertionError(f"{path}'s tensor data was read")

    monkeypatch.setattr(hf, "_shard_tensors", no_data)
    message = "weights do not match the config: model.layers.0.mlp.gate_proj.weight has shape (64, 32), expected (128"
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        load_model(directory)
    assert str(caught.value).startswith(f"{directory}: ")


def test_a_shard_missing_from_a_series_read_without_its_index_is_named(kit, tmp_path):
    """Shards downloaded without their index, one of them not: refused only as weights missing by their names."""
    directory = tmp_path / "sharded"
    write_checkpoint(kit, directory, hf_config(kit), shards=3)
    (directory / "model.safetensors.index.json").unlink()
    (directory / "model-00002-of-00003.safetensors").unlink()
    message = f"{directory}: shard model-00002-of-00003.safetensors is missing (2 of 3 are here)"
    with pytest.raises(FileNotFoundError, match=re.escape(message)):
        load_model(directory)
