"""Hugging Face model directories: config.json -> ModelConfig, *.safetensors (sharded too) -> weights."""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from safetensors import SafetensorError, safe_open

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.loading.rope_scaling import hf_rope
from radixcache.runtime.loading.weights import (
    check_heads,
    check_weights,
    config_float,
    config_int,
    refuse_lfs_pointer,
)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_SHARD_RE = re.compile(r"(?P<stem>.+)-(?P<part>\d+)-of-(?P<total>\d+)\.safetensors")


def read_hf_config(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """config.json as a dict; ValueError naming the file when it is not a JSON object."""
    path = os.path.join(os.fspath(directory), "config.json")
    return read_json_object(path)


def read_json_object(path: str) -> dict[str, Any]:
    """A JSON file that must hold an object; ValueError naming the file for broken JSON or another value."""
    with open(path, encoding="utf-8") as f:
        try:
            value = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        except RecursionError:  # arrays or objects nested thousands deep: the decoder recurses per level
            raise ValueError(f"{path}: not JSON this loader reads (nested too deeply)") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def check_added_token_ids(backend: Any, path: str) -> None:
    """ValueError naming tokenizer.json (`path`) and the token when the tokenizers library numbered an added token
    otherwise than the file says: it renumbers without a word (a Rust log line nobody sees) an added token whose id
    another token holds (a vocabulary entry, or an added token before it) or whose id leaves a gap after the last
    one, so `encode` gave ids the model was not trained on, and a decode of the declared id another token's text."""
    for entry in read_json_object(path).get("added_tokens") or []:
        declared, text = (entry.get("id"), entry.get("content")) if isinstance(entry, dict) else (None, None)
        if not isinstance(text, str) or isinstance(declared, bool) or not isinstance(declared, int):
            raise ValueError(f"{path}: added token {entry!r} needs an integer id and a text content")
        if (given := backend.token_to_id(text)) != declared:
            holder = backend.id_to_token(declared) if declared >= 0 else None
            why = (
                f"id {declared} is the token {holder!r}"
                if holder not in (None, text)
                else "it gives added tokens the ids after the vocabulary's, in order, or a vocabulary text its id"
            )
            raise ValueError(
                f"{path}: added token {text!r} says id {declared}, but the tokenizers library numbers it {given} "
                f"({why}): every added token needs an id of its own, following the vocabulary's"
            )


def config_from_hf(
    cfg: dict[str, Any], name: str = "model", eos_token_ids: tuple[int, ...] = (), where: str | None = None
) -> ModelConfig:
    """The ModelConfig of a Llama, Mistral or Qwen2 config.json. ValueError for what the runtime cannot run exactly,
    and for a field that is missing, of the wrong type or out of range; messages start with `where` (the file),
    else `name`."""
    where = where or name
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{where}: model_type {model_type!r} is not supported ({', '.join(SUPPORTED_MODEL_TYPES)})")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: hidden_act {cfg['hidden_act']!r} is not supported (only silu)")
    if cfg.get("mlp_bias"):
        raise ValueError(f"{where}: mlp_bias is not supported")
    if model_type != "qwen2" and cfg.get("attention_bias"):
        raise ValueError(f"{where}: attention_bias on a {model_type} model (o_proj bias too) is not supported")
    rope_theta, rope_scaling = hf_rope(cfg, where)

    def integer(key: str, default: Any = None) -> int:
        """A field that must be a positive integer; a null or absent one takes `default` when there is one."""
        value = cfg.get(key)
        if value is None and default is None:
            raise ValueError(f"{where}: {key} is missing")
        return config_int(default if value is None else value, f"{where}: {key}")

    def number(key: str, default: float) -> float:
        value = cfg.get(key)
        return config_float(default if value is None else value, f"{where}: {key}")

    def flag(key: str) -> bool:
        """A boolean field, false when null or absent: the string "false" is true to bool(), which tied the
        embeddings of a model that has its own head (garbage, with no error)."""
        value = cfg.get(key)
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{where}: {key} must be true or false, got {value!r}")
        return bool(value)

    hidden, heads = integer("hidden_size"), integer("num_attention_heads")
    max_position = integer("max_position_embeddings", 2048)
    # Sliding-window attention is not implemented: the model is exact only up to the window, so cap the context.
    if cfg.get("sliding_window") and (model_type == "mistral" or cfg.get("use_sliding_window")):
        max_position = min(max_position, integer("sliding_window"))
    bos = cfg.get("bos_token_id")
    config = ModelConfig(
        arch=model_type,
        vocab_size=integer("vocab_size"),
        hidden_size=hidden,
        intermediate_size=integer("intermediate_size"),
        num_layers=integer("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=integer("num_key_value_heads", heads),
        head_dim=integer("head_dim", hidden // heads),
        rope_theta=rope_theta,
        rms_norm_eps=number("rms_norm_eps", 1e-6),  # the transformers default for all three
        max_position=max_position,
        tie_embeddings=flag("tie_word_embeddings"),
        attention_bias=model_type == "qwen2",  # Qwen2 always has q/k/v biases
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_ids=tuple(eos_token_ids),
        name=name,
        rope_scaling=rope_scaling,
    )
    check_heads(config, where)
    return config


def safetensors_files(directory: str | os.PathLike[str]) -> list[str]:
    """The checkpoint's safetensors files: those the shard index names, else model.safetensors (the two files
    transformers reads), else every *.safetensors file. A Mistral repository's consolidated.safetensors (the same
    weights under Mistral's own names) or a LoRA adapter's adapter_model.safetensors beside them is not read."""
    directory = os.fspath(directory)
    index_path = os.path.join(directory, INDEX_FILE)
    if os.path.isfile(index_path):
        weight_map = read_json_object(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(shard, str) for shard in weight_map.values()):
            raise ValueError(f"{index_path}: weight_map is not an object of tensor names to shard files")
        outside = next((f for f in weight_map.values() if os.path.basename(f) != f or f in ("", ".", "..")), None)
        if outside is not None:  # a shard is a file of this directory: "../x" or "/x" would load another's weights
            raise ValueError(f"{index_path}: shard {outside!r} is not a file name in the model directory")
        files = [os.path.join(directory, shard) for shard in sorted(set(weight_map.values()))]
        missing = [p for p in files if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"{directory}: {INDEX_FILE} names missing shards {missing[:3]}")
        return files
    single = os.path.join(directory, SINGLE_FILE)
    if os.path.isfile(single):
        return [single]
    files = sorted(p for p in glob.glob(os.path.join(glob.escape(directory), "*.safetensors")) if os.path.isfile(p))
    if not files:
        extra = (
            " (pytorch_model.bin checkpoints are not supported)"
            if glob.glob(os.path.join(glob.escape(directory), "*.bin"))
            else ""
        )
        raise FileNotFoundError(f"{directory}: no *.safetensors files{extra}")
    _check_shard_series(directory, files)
    return files


def _check_shard_series(directory: str, files: list[str]) -> None:
    """FileNotFoundError naming the first missing shard of a series ("model-00002-of-00003.safetensors") read
    without its index: a download that stopped between shards was refused only as weights missing by name."""
    series: dict[tuple[str, int, int], set[int]] = {}
    for path in files:
        if m := _SHARD_RE.fullmatch(os.path.basename(path)):
            series.setdefault((m["stem"], int(m["total"]), len(m["total"])), set()).add(int(m["part"]))
    for (stem, total, width), parts in series.items():
        if missing := next((k for k in range(1, min(total, 10**5) + 1) if k not in parts), None):
            name = f"{stem}-{missing:0{width}d}-of-{total:0{width}d}.safetensors"
            raise FileNotFoundError(f"{directory}: shard {name} is missing ({len(parts)} of {total} are here)")


class _Stored(NamedTuple):
    """A stored tensor as its file's header describes it (check_weights reads `shape`)."""

    shape: tuple[int, ...]


def _stored_shapes(files: list[str]) -> dict[str, _Stored]:
    """Each stored tensor's Hugging Face name and shape, from the files' headers alone (no tensor data is read)."""
    shapes: dict[str, _Stored] = {}
    for path in files:
        try:
            with safe_open(path, framework="pt", device="cpu") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if key.endswith("rotary_emb.inv_freq"):
                        continue
                    stored = f.get_slice(key)
                    if not stored.get_dtype().startswith(("F", "BF")):  # int8 / uint8 codes of a quantised checkpoint
                        raise ValueError(
                            f"{path}: tensor {key} is {stored.get_dtype()}; only floating-point weights are supported"
                        )
                    shapes[_hf_key(key)] = _Stored(tuple(stored.get_shape()))
        except SafetensorError as e:  # a header that lies about its length or offsets, a truncated file
            refuse_lfs_pointer(path)
            raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    return shapes


def _hf_key(key: str) -> str:
    """A stored name as the model's: checkpoints of the bare model (no "model." prefix) are renamed."""
    return key if key.startswith(("model.", "lm_head.")) else "model." + key


def _shard_tensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of one safetensors file by their stored names, one at a time (a shard's stored copies are never
    all held with the converted ones), rotary `inv_freq` buffers left out."""
    with safe_open(path, framework="pt", device="cpu") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            if not key.endswith("rotary_emb.inv_freq"):
                yield key, f.get_tensor(key)


def load_hf_weights(
    directory: str | os.PathLike[str],
    config: ModelConfig,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint under Hugging Face names, cast to `dtype` on `device`.

    Dropped: rotary `inv_freq` buffers of old checkpoints, and `lm_head.weight` when embeddings are tied.
    Checkpoints of the bare model (no "model." prefix) are renamed. Integer tensors, and names or shapes that do
    not fit `config`, are refused from the files' headers, before any tensor data is read.
    """
    files = safetensors_files(directory)
    stored = _stored_shapes(files)
    if config.tie_embeddings:
        stored.pop("lm_head.weight", None)
    # Names and shapes checked before any data is read: a checkpoint of another size (a 7B beside a config.json of
    # one layer) was read whole into float32 first, which can take more memory than the machine has.
    check_weights(config, stored, os.fspath(directory))
    weights: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            for key, tensor in _shard_tensors(path):
                name = _hf_key(key)
                if name in weights:
                    raise ValueError(f"{directory}: tensor {name} appears in more than one shard")
                if not tensor.is_floating_point():  # int8 / uint8 codes of a quantised checkpoint, not weights
                    raise ValueError(
                        f"{path}: tensor {key} is {tensor.dtype}; only floating-point weights are supported"
                    )
                weights[name] = tensor.to(dtype=dtype, device=device)
        except SafetensorError as e:  # a header that lies about its length or offsets, a truncated file
            refuse_lfs_pointer(path)
            raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    if config.tie_embeddings:
        weights.pop("lm_head.weight", None)
    return weights
