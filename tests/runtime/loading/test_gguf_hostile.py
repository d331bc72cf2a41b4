"""Hostile GGUF model files: metadata of the wrong type or out of range, tensors that disagree with it. Each is
refused with a ValueError that starts with the file and says what is wrong, before any tensor data is dequantised."""

from __future__ import annotations

import dataclasses
import re

import pytest

from radixcache.runtime.loading import load_model
from tests.runtime.loading.test_gguf_model import random_weights, tiny_config, write_tiny_gguf

A = "llama."


def refused(path, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        load_model(path)
    assert str(caught.value).startswith(f"{path}: "), caught.value


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({A + "attention.head_count": 0}, "llama.attention.head_count is 0, expected at least 1"),
        ({A + "attention.head_count_kv": 0}, "llama.attention.head_count_kv is 0, expected at least 1"),
        ({A + "attention.head_count": (5, -4)}, "llama.attention.head_count is -4"),  # an INT32
        ({A + "attention.head_count": "four"}, "llama.attention.head_count is 'four', not an integer"),
        ({A + "attention.head_count": (9, 4, [4, 4])}, "llama.attention.head_count is array"),  # U32[2]
        ({A + "attention.head_count": 4.5}, "llama.attention.head_count is 4.5, not an integer"),
        ({A + "feed_forward_length": "x"}, "llama.feed_forward_length is 'x', not an integer"),
        ({A + "context_length": 0}, "llama.context_length is 0"),
        ({A + "block_count": 0}, "llama.block_count is 0"),
        # 10**8 listed 10**9 expected weights (a MemoryError after half a minute) before naming one missing
        ({A + "block_count": 10**5}, "it has 100000 layers, but there are only 20 weights in all"),
        ({A + "attention.head_count_kv": 3}, "4 attention heads are not a multiple of 3 KV heads"),
        ({A + "attention.key_length": 15, A + "rope.dimension_count": 15}, "head_dim 15 is odd"),
        ({A + "attention.layer_norm_rms_epsilon": float("nan")}, "layer_norm_rms_epsilon is nan, expected a finite"),
        ({A + "rope.freq_base": 0.0}, "llama.rope.freq_base is 0.0, expected a finite number above 0"),
        ({A + "rope.freq_base": -1.0}, "llama.rope.freq_base is -1.0"),
        # Mixtral: refused by its SentencePiece vocabulary or 'unexpected tensor blk.0.ffn_gate_inp', not as MoE
        ({A + "expert_count": 8}, "llama.expert_count is 8: mixture-of-experts models are not supported"),
        # a U32[2] array: its `in` asked an array's truth, a numpy error naming neither file nor key
        ({"general.architecture": (9, 4, [1, 2])}, "GGUF architecture array([1, 2], dtype=uint32) is not supported"),
    ],
)
def test_metadata_of_the_wrong_type_or_out_of_range_is_named(kit, tmp_path, overrides, message):
    cfg = tiny_config(kit)
    write_tiny_gguf(kit, tmp_path / "bad.gguf", cfg, random_weights(cfg), meta_overrides=overrides)
    refused(tmp_path / "bad.gguf", message)


def test_a_tensor_that_disagrees_with_the_head_counts_is_named_before_dequantising(kit, tmp_path):
    """q_proj with 3 heads' rows where the metadata says 4: named by its shape, not a reshape error while its
    rows are un-permuted."""
    cfg = tiny_config(kit)
    weights = random_weights(cfg)
    weights["model.layers.1.self_attn.q_proj.weight"] = weights["model.layers.1.self_attn.q_proj.weight"][:48]
    write_tiny_gguf(kit, tmp_path / "bad.gguf", cfg, weights)
    refused(tmp_path / "bad.gguf", "model.layers.1.self_attn.q_proj.weight has shape (48, 32), expected (64, 32)")


def test_a_tensor_of_a_type_that_cannot_be_dequantised_is_named(kit, tmp_path):
    cfg = tiny_config(kit)
    write_tiny_gguf(kit, tmp_path / "q8_1.gguf", cfg, random_weights(cfg))
    data = bytearray((tmp_path / "q8_1.gguf").read_bytes())
    # Retype blk.0.ffn_down.weight (F32) as Q8_1 (id 9) in the tensor index: its type field follows the dims.
    name = b"blk.0.ffn_down.weight"
    at = data.index(name) + len(name)
    n_dims = int.from_bytes(data[at : at + 4], "little")
    data[at + 4 + 8 * n_dims : at + 8 + 8 * n_dims] = (9).to_bytes(4, "little")
    (tmp_path / "q8_1.gguf").write_bytes(bytes(data))
    refused(tmp_path / "q8_1.gguf", "tensor blk.0.ffn_down.weight is of GGML type Q8_1, which cannot be dequantised")


def test_an_unexpected_tensor_name_names_the_file(kit, tmp_path):
    cfg = tiny_config(kit)
    write_tiny_gguf(kit, tmp_path / "extra.gguf", cfg, random_weights(cfg))
    data = (tmp_path / "extra.gguf").read_bytes().replace(b"blk.1.ffn_up.weight", b"blk.1.ffn_xx.weight")
    (tmp_path / "extra.gguf").write_bytes(data)
    refused(tmp_path / "extra.gguf", "unexpected GGUF tensor 'blk.1.ffn_xx.weight'")


T = "tokenizer.ggml."


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({T + "model": "llama"}, "GGUF tokenizer model 'llama' is not supported"),
        ({T + "pre": "made-up"}, "GGUF pre-tokenizer 'made-up' is not supported"),
        ({T + "model": (9, 4, [1, 2])}, "GGUF tokenizer model array([1, 2], dtype=uint32) is not supported"),
        ({T + "pre": (9, 4, [1, 2])}, "GGUF pre-tokenizer array([1, 2], dtype=uint32) is not supported"),
        ({T + "tokens": None}, "tokenizer.ggml.tokens is missing or empty"),
        ({T + "tokens": (9, 4, [1, 2, 3])}, "tokenizer.ggml.tokens is not an array of strings"),  # U32[3]
        ({T + "merges": (9, 8, ["abc"])}, "tokenizer.ggml.merges holds a merge without a space"),
        # a plain Exception of tokenizers, without the file: the CLI called it an internal error
        ({T + "merges": (9, 8, ["q z"])}, "tokenizer.ggml.merges does not fit tokenizer.ggml.tokens (Error while"),
        ({T + "token_type": (9, 5, [3] * 1000)}, "tokenizer.ggml.token_type has 1000 entries for 265 tokens"),
        ({T + "token_type": "x"}, "tokenizer.ggml.token_type is not an array of integers"),
        ({T + "bos_token_id": "x", T + "add_bos_token": True}, "tokenizer.ggml.bos_token_id is 'x', not an integer"),
        ({T + "bos_token_id": 10**6, T + "add_bos_token": True}, "bos_token_id is 1000000, past the 265 tokens"),
        ({T + "eos_token_id": (5, -1)}, "tokenizer.ggml.eos_token_id is -1, expected at least 0"),
        ({T + "eos_token_id": 10**6}, "tokenizer.ggml.eos_token_id is 1000000, past the 265 tokens"),
        ({"tokenizer.chat_template": 5}, "tokenizer.chat_template is int, not text"),
        # the text "false" is true to bool(): every prompt got a BOS the file said not to add
        ({T + "add_bos_token": "false"}, "tokenizer.ggml.add_bos_token is 'false', not true or false"),
    ],
)
def test_tokenizer_metadata_of_the_wrong_kind_type_or_length_is_named(kit, tmp_path, overrides, message):
    """Each a ValueError (an unsupported kind of vocabulary is a NotImplementedError too), so the CLI says what is
    wrong with the file instead of reporting an internal error."""
    cfg = tiny_config(kit)
    write_tiny_gguf(kit, tmp_path / "bad.gguf", cfg, random_weights(cfg), meta_overrides=overrides)
    refused(tmp_path / "bad.gguf", message)


def test_more_tokens_than_embedding_rows_is_refused(kit, tmp_path):
    """265 tokens over a 200-row embedding loaded, and then every prompt holding one of the last 65 tokens failed
    as 'outside the vocabulary' (the vocabulary is the embedding's rows)."""
    cfg = dataclasses.replace(tiny_config(kit), vocab_size=200)
    write_tiny_gguf(kit, tmp_path / "short.gguf", cfg, random_weights(cfg))
    refused(tmp_path / "short.gguf", "tokenizer.ggml.tokens has 265 tokens but token_embd.weight only 200 rows")
