"""A float32 CPU model runs RMSNorm and the decode mirror's attention natively (runtime.native.ops) where the native
library builds, and PyTorch's where it does not: the engine's greedy tokens are the same either way (decode batches
of 4 down to 1, through the mirror), the decode logits stay within float32 error of a float64 reference, and a
machine without the library keeps the PyTorch versions instead of failing."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from radixcache.runtime.engine.engine import Engine
from radixcache.runtime.kv.mirror import DecodeMirror
from radixcache.runtime.model import llama_weights
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.model.reference import reference_logits
from radixcache.runtime.native import NativeBuildError
from radixcache.runtime.testing import random_weights, tiny_config

CONFIG = tiny_config(max_position=512)
WEIGHTS = random_weights(CONFIG, seed=33)
HAS_CC = shutil.which(os.environ.get("CC", "cc")) is not None


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(4)
    return [torch.randint(1, CONFIG.vocab_size, (n,), generator=g).tolist() for n in (5, 17, 40, 70)]


def _greedy(model: LlamaModel) -> list[tuple[int, ...]]:
    with Engine(model, kernels="fixed", threads=1, capacity_blocks=128, enable_cache=False) as engine:
        together = engine.generate(_prompts(), max_new_tokens=12, temperature=0.0, ignore_eos=True)
        alone = engine.generate(_prompts()[1], max_new_tokens=8, temperature=0.0, ignore_eos=True)
    return [r.token_ids for r in (*together, alone)]


@pytest.mark.skipif(not HAS_CC, reason="the native kernels need a C compiler")
def test_greedy_tokens_equal_with_native_and_pytorch_norm_and_attention() -> None:
    native = LlamaModel(CONFIG, WEIGHTS)
    plain = LlamaModel(CONFIG, WEIGHTS)
    plain.native = None  # before the engine builds its mirror, which takes the model's ops
    assert native.native is not None
    assert _greedy(native) == _greedy(plain)


@pytest.mark.skipif(not HAS_CC, reason="the native kernels need a C compiler")
def test_native_decode_logits_stay_within_float32_error_of_a_float64_reference() -> None:
    model = LlamaModel(CONFIG, WEIGHTS)
    assert model.native is not None
    ids = _prompts()[2]
    want = reference_logits(CONFIG, WEIGHTS, ids, dtype=torch.float64)
    pool = model.new_pool(16, 16)
    table = list(range(4))
    model.prefill(ids[:30], 0, table, pool)
    mirror = DecodeMirror(CONFIG, torch.float32, "cpu", 1 << 30, native=model.native)
    for pos in range(30, len(ids)):
        step = mirror.prepare([0], [table], [pos + 1], pool)
        meta = build_decode_meta([table], [pos + 1], 16, model.device)
        logits = model.decode([ids[pos]], meta, pool, step)
        mirror.commit(step)
        err = (logits[0].double() - want[pos]).abs().max().item()
        assert err < 1e-4, f"position {pos}: {err:.3g}"


def test_a_float32_model_without_the_native_library_keeps_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library() -> None:
        raise NativeBuildError("no C compiler (test)")

    monkeypatch.setattr("radixcache.runtime.native.ops.NativeDecodeOps", no_library)
    model = LlamaModel(CONFIG, WEIGHTS)
    assert model.native is None
    with pytest.raises(NativeBuildError):
        llama_weights._native_ops(required=True)  # quant="gguf" still needs it
    ids = _prompts()[0]
    want = reference_logits(CONFIG, WEIGHTS, ids, dtype=torch.float64)
    pool = model.new_pool(4, 16)
    got = model.prefill(ids, 0, [0], pool, all_logits=True)
    assert (got.double() - want).abs().max().item() < 1e-4
