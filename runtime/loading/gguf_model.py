"""GGUF metadata -> ModelConfig, and GGUF tensors -> Hugging Face-named float32 weights.

llama.cpp's converter permutes the rows of Q and K (and their biases) of `llama` models, per head, so that its
interleaved RoPE (rotating pairs 2i, 2i+1) computes what Hugging Face's rotate-half RoPE (pairs i, i + d/2) does:

    permuted = w.reshape(heads, 2, head_dim // 2, ...).swapaxes(1, 2).reshape(w.shape)

`unpermute_rope_rows` inverts it. `qwen2` files are not permuted (llama.cpp runs them with NEOX, rotate-half, RoPE).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.cores import usable_cores
from radixcache.runtime.loading.gguf import GGUFFile
from radixcache.runtime.loading.gguf_tokenizer import LLAMA3_PRE
from radixcache.runtime.loading.rope_scaling import ROPE_FREQS, gguf_rope_scaling
from radixcache.runtime.loading.weights import check_heads, check_weights, config_float, config_int
from radixcache.runtime.model.dequant import DEQUANTISABLE

if TYPE_CHECKING:
    from radixcache.runtime.model.block_linear import BlockWeight

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2")
_PERMUTED_ARCHS = ("llama", "mistral")

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF tensor name; ValueError for tensors a Llama-family model does not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for a Llama-family model")


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head interleaving of Q/K rows (weight [heads*head_dim, in] or bias [heads*head_dim])."""
    head_dim = w.shape[0] // n_heads
    rest = w.shape[1:]
    return np.ascontiguousarray(w.reshape(n_heads, head_dim // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape))


def _f32(x: Any) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(x)))


def gguf_adds_bos(meta: dict[str, Any], where: str = "GGUF metadata") -> bool:
    """Whether the model's tokenizer prepends BOS: `tokenizer.ggml.add_bos_token`, else llama.cpp's default (yes for
    SentencePiece `llama` vocabularies and for Llama 3's pre-tokenizer names, which older Llama 3 files rely on).
    ValueError naming `where` (the file) unless the key is a boolean (or 0 / 1): the text "false" is true to bool()."""
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")  # arrays compare elementwise
    default = (isinstance(kind, str) and kind == "llama") or (isinstance(pre, str) and pre in LLAMA3_PRE)
    value = meta.get("tokenizer.ggml.add_bos_token", default)
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise ValueError(f"{where}: GGUF metadata tokenizer.ggml.add_bos_token is {value!r}, not true or false")


def gguf_token_id(meta: dict[str, Any], key: str, where: str = "GGUF metadata") -> int | None:
    """The token id under `key` (None when absent); ValueError naming `where` (the file) and the key unless it is
    an integer that indexes tokenizer.ggml.tokens."""
    if key not in meta:
        return None
    token_id = config_int(meta[key], f"{where}: GGUF metadata {key}", minimum=0)
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and token_id >= len(tokens):
        raise ValueError(f"{where}: GGUF metadata {key} is {token_id}, past the {len(tokens)} tokens of the vocabulary")
    return token_id


def gguf_eos_ids(meta: dict[str, Any], where: str = "GGUF metadata") -> tuple[int, ...]:
    """End-of-sequence ids: EOS, then end-of-turn / end-of-message when the file names them."""
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        token_id = gguf_token_id(meta, key, where)
        if token_id is not None and token_id not in ids:
            ids.append(token_id)
    return tuple(ids)


def config_from_gguf(gguf: GGUFFile, name: str | None = None) -> ModelConfig:
    """The ModelConfig a GGUF file describes. ValueError naming the file and key for architectures or features that
    are not supported and for metadata of the wrong type or out of range."""
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or arch not in SUPPORTED_ARCHS:  # an array's `in` asked its truth: a numpy error
        raise ValueError(f"{gguf.path}: GGUF architecture {arch!r} is not supported ({', '.join(SUPPORTED_ARCHS)})")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"{gguf.path}: GGUF metadata lacks {arch}.{key}")
        return value

    def integer(key: str, default: Any = None, minimum: int = 1) -> int:
        return config_int(get(key, default), f"{gguf.path}: GGUF metadata {arch}.{key}", minimum)

    def number(key: str, default: float) -> float:
        return config_float(get(key, default), f"{gguf.path}: GGUF metadata {arch}.{key}")

    # Mixtral's files are `llama` ones with experts: named here, not by their vocabulary or first expert tensor
    if (experts := config_int(get("expert_count", 0), f"{gguf.path}: GGUF metadata {arch}.expert_count", 0)) > 0:
        raise ValueError(
            f"{gguf.path}: GGUF metadata {arch}.expert_count is {experts}: mixture-of-experts models are not supported"
        )
    embed = gguf.tensors.get("token_embd.weight")
    if embed is None:
        raise ValueError(f"{gguf.path}: GGUF file has no token_embd.weight")
    if len(embed.shape) != 2 or embed.shape[0] < 1:
        raise ValueError(f"{gguf.path}: token_embd.weight has shape {embed.shape}, expected [vocab, hidden]")
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(tokens) > embed.shape[0]:  # llama.cpp requires one row per token
        raise ValueError(
            f"{gguf.path}: tokenizer.ggml.tokens has {len(tokens)} tokens but token_embd.weight only "
            f"{embed.shape[0]} rows: text would encode to ids the model has no embedding for"
        )
    hidden, heads = integer("embedding_length"), integer("attention.head_count")
    head_dim = integer("attention.key_length", hidden // heads)
    rope_dims = integer("rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise ValueError(f"{gguf.path}: partial RoPE ({rope_dims} of {head_dim} dims) is not supported")
    adds_bos = gguf_adds_bos(meta, gguf.path) and "tokenizer.ggml.bos_token_id" in meta
    config = ModelConfig(
        arch=arch,
        vocab_size=int(embed.shape[0]),
        hidden_size=hidden,
        intermediate_size=integer("feed_forward_length"),
        num_layers=integer("block_count"),
        num_heads=heads,
        num_kv_heads=integer("attention.head_count_kv", heads),
        head_dim=head_dim,
        rope_theta=_f32(number("rope.freq_base", 10000.0)),
        rms_norm_eps=_f32(number("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position=integer("context_length", 2048),
        tie_embeddings="output.weight" not in gguf.tensors,
        attention_bias="blk.0.attn_q.bias" in gguf.tensors,
        bos_token_id=gguf_token_id(meta, "tokenizer.ggml.bos_token_id", gguf.path) if adds_bos else None,
        eos_token_ids=gguf_eos_ids(meta, gguf.path),
        name=name or os.path.splitext(os.path.basename(gguf.path))[0],
        rope_scaling=gguf_rope_scaling(gguf, arch, head_dim),
    )
    check_heads(config, gguf.path)
    return config


def load_gguf_weights(
    gguf: GGUFFile,
    config: ModelConfig,
    convert: Callable[[np.ndarray], Any] | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Every tensor dequantised to float32, under its Hugging Face name, Q/K rows in rotate-half order, then passed
    through `convert` (e.g. to a torch tensor of another dtype) if given.

    Work runs on a thread pool (numpy and torch release the GIL), which roughly halves load time on 2+ cores.
    """
    names = check_gguf_tensors(gguf, config)
    permute = config.arch in _PERMUTED_ARCHS

    def load(gguf_name: str) -> tuple[str, np.ndarray]:
        name = names[gguf_name]
        w = gguf.dequantize(gguf_name)
        if permute and ".self_attn.q_proj." in name:
            w = unpermute_rope_rows(w, config.num_heads)
        elif permute and ".self_attn.k_proj." in name:
            w = unpermute_rope_rows(w, config.num_kv_heads)
        return name, convert(w) if convert is not None else w

    workers = threads or min(8, usable_cores())  # the affinity's CPUs within the cgroup quota, not the host's
    # Largest first, so the big embedding does not start last and hold up the pool.
    order = sorted(names, key=lambda n: -gguf.tensors[n].nbytes)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(load, order))


def check_gguf_tensors(gguf: GGUFFile, config: ModelConfig) -> dict[str, str]:
    """The Hugging Face name of each tensor, once the index (not the data) shows every tensor is one the model
    takes, of the shape `config` implies and of a type that can be dequantised: a bad file is refused naming the
    file and the tensor before any data is read, and the Q/K un-permutation never sees rows it cannot split."""
    names = {}
    for gguf_name, info in gguf.tensors.items():
        if gguf_name == ROPE_FREQS:  # read into the config (config_from_gguf), not a weight
            continue
        try:
            names[gguf_name] = hf_name(gguf_name)
        except ValueError as e:
            raise ValueError(f"{gguf.path}: {e}") from None
        if info.type_name not in DEQUANTISABLE:
            raise ValueError(
                f"{gguf.path}: tensor {gguf_name} is of GGML type {info.type_name}, which cannot be dequantised "
                f"(supported: {', '.join(DEQUANTISABLE)})"
            )
    check_weights(config, {names[n]: gguf.tensors[n] for n in names}, gguf.path)
    return names


def load_gguf_blocks(gguf: GGUFFile, config: ModelConfig) -> dict[str, BlockWeight]:
    """The 2-D tensors of a kind the block kernels take (block_linear.KINDS: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
    Q5_K, Q6_K) as their raw blocks (copied out of the map), under Hugging Face names, with Q/K rows in rotate-half
    order like `load_gguf_weights`: a row of blocks is one output row, so undoing the per-head interleaving moves
    whole rows of blocks. Tensors of other types are left out (they stay dense)."""
    from radixcache.runtime.model.block_linear import BLOCK_BYTES, BLOCK_ELEMS, BlockWeight

    permute = config.arch in _PERMUTED_ARCHS
    out: dict[str, BlockWeight] = {}
    for gguf_name, info in gguf.tensors.items():
        kind = info.type_name
        if kind not in BLOCK_BYTES or len(info.shape) != 2 or info.shape[1] % BLOCK_ELEMS[kind]:
            continue
        name = hf_name(gguf_name)
        rows, cols = info.shape
        raw = gguf.raw(gguf_name).reshape(rows, cols // BLOCK_ELEMS[kind] * BLOCK_BYTES[kind])
        if permute and ".self_attn.q_proj." in name:
            raw = unpermute_rope_rows(raw, config.num_heads)
        elif permute and ".self_attn.k_proj." in name:
            raw = unpermute_rope_rows(raw, config.num_kv_heads)
        out[name] = BlockWeight(kind, torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True)), cols)
    return out
