"""GGUF files of every block kind the kernels take, K-quants included (what Q4_K_M files hold), written with the
`gguf` package's writer (tests/runtime/loading/gguf_files.py; K-quant bytes from the test encoder kquants.py).

- runtime.model.dequant decodes each kind bit for bit as the `gguf` package's own dequantiser does, on encoded
  weights and on random bytes; the test encoder's values are within the kind's quantisation step of the input.
- A tiny llama model saved in each kind, and in a Q4_K_M-like mix (Q4_K / Q6_K / Q5_0 / Q8_0, mixed kinds inside
  the fused q/k/v matrix), loads with its blocks kept (each block tensor dequantises exactly to the loaded float
  weight, Q/K rows un-permuted), and quant="gguf" runs it: logits of a prefill and of decode steps through the
  float-activation kernel equal float32's within summation-order slack; each loaded layer's int8 product equals
  the float64 product with the activations rounded as this test rounds them; the int8 model's logits stay within
  the few percent activation rounding costs a random-weight model (a wrong block, scale or part costs order 1).
"""

from __future__ import annotations

import os
import shutil

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.loading import load_model
from radixcache.runtime.loading.weights import expected_shapes
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.block_linear import BLOCK_BYTES, BLOCK_ELEMS, KINDS, BlockLinear
from radixcache.runtime.model.dequant import GGML_TYPE_IDS, dequantize
from radixcache.runtime.model.llama import LlamaModel
from tests.runtime.loading.gguf_files import q4_k_m_kind, write_model_gguf
from tests.runtime.loading.kquants import quantised_activations, quantize

needs_cc = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler here")
# Largest |x - decoded| per element over the largest |x| of its block (super-block for the K-quants): half a step,
# the step being the block's range over the kind's integer levels (Q4_0 / Q5_0 put their peak at -8 / -16, so the
# other sign clips by a full step: 1/8, 1/16), with room for the float16 scales and the K-quants' 6-bit scales.
STEP = {"Q4_0": 0.13, "Q4_1": 0.07, "Q5_0": 0.065, "Q5_1": 0.035, "Q8_0": 0.006, "Q4_K": 0.07, "Q5_K": 0.035}
STEP["Q6_K"] = 0.02


def _unit_normal_with_outliers(rows: int, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (rows, cols)).astype(np.float32)
    x[rng.random((rows, cols)) < 0.01] *= 8  # a few large values, as real weights have
    return x


@pytest.mark.parametrize("kind", KINDS)
def test_the_dequantiser_equals_the_gguf_packages_bit_for_bit(kind: str) -> None:
    x = _unit_normal_with_outliers(6, 512, seed=1)
    encoded = quantize(x, kind)
    assert encoded.shape == (6, 512 // BLOCK_ELEMS[kind] * BLOCK_BYTES[kind])
    ref = gguf_dequantize(encoded, gguf.GGMLQuantizationType[kind]).astype(np.float32)
    got = dequantize(encoded.reshape(-1), GGML_TYPE_IDS[kind], x.shape)
    np.testing.assert_array_equal(got, ref)
    # random bytes: every bit pattern of the quants, scales and (K-quant) packed sub-block scales
    rng = np.random.default_rng(2)
    raw = rng.integers(0, 256, (40, BLOCK_BYTES[kind]), dtype=np.uint8)
    halves = [0, 2] if kind in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else [208] if kind == "Q6_K" else [0]
    for offset in halves:  # finite float16 scales (random bytes can be NaN, which never compares equal)
        raw[:, offset : offset + 2] = rng.uniform(-0.1, 0.1, 40).astype("<f2").view(np.uint8).reshape(-1, 2)
    ref = gguf_dequantize(raw, gguf.GGMLQuantizationType[kind]).astype(np.float32).reshape(-1)
    np.testing.assert_array_equal(dequantize(raw.reshape(-1), GGML_TYPE_IDS[kind], ref.shape), ref)


@pytest.mark.parametrize("kind", KINDS)
def test_encoded_values_are_within_the_kinds_step(kind: str) -> None:
    x = _unit_normal_with_outliers(4, 1024, seed=3)
    got = dequantize(quantize(x, kind).reshape(-1), GGML_TYPE_IDS[kind], x.shape)
    peak = np.abs(x.reshape(4, -1, BLOCK_ELEMS[kind])).max(axis=2, keepdims=True)
    worst = (np.abs(got - x).reshape(peak.shape[0], peak.shape[1], -1) / peak).max()
    assert worst <= STEP[kind], worst


def test_a_k_quant_row_that_is_not_whole_super_blocks_is_refused() -> None:
    with pytest.raises(ValueError, match="576 columns is not a multiple"):
        quantize(np.zeros((2, 576), np.float32), "Q4_K")


# ---------------------------------------------------------------------- a tiny model in each kind


def tiny_config(vocab: int) -> ModelConfig:
    return ModelConfig(
        arch="llama", vocab_size=vocab, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=64, rope_theta=1e4, rms_norm_eps=1e-5, max_position=256, tie_embeddings=True,
        attention_bias=False, eos_token_ids=(2,), name="tiny",
    )  # fmt: skip


def _logits(model: LlamaModel) -> torch.Tensor:
    """A 6-token prefill (every product through the block kernel: 6 rows), then 3 decode steps of 2 sequences."""
    pool = model.new_pool(8, 16)
    tables = [[0, 1], [2, 3]]
    out = [
        model.prefill(ids, 0, t, pool).reshape(-1, model.config.vocab_size)
        for ids, t in zip(PROMPTS, tables, strict=True)
    ]
    lengths = [len(p) for p in PROMPTS]
    for step in ([5, 9], [11, 3], [7, 7]):
        lengths = [n + 1 for n in lengths]
        out.append(model.decode(step, build_decode_meta(tables, lengths, 16, model.device), pool))
    return torch.cat(out)


PROMPTS = ([4, 8, 15, 16, 23, 42], [100, 101, 102, 103, 104, 105])


@needs_cc
@pytest.mark.parametrize("recipe", [*KINDS, "Q4_K_M"])
def test_a_file_of_each_kind_loads_and_runs(kit, tmp_path, monkeypatch: pytest.MonkeyPatch, recipe: str) -> None:
    meta = kit.tiny_tokenizer_metadata(typed=False)
    cfg = tiny_config(len(meta["tokenizer.ggml.tokens"]))
    rng = np.random.default_rng(4)
    weights = {k: rng.normal(0, 0.08, s).astype(np.float32) for k, s in expected_shapes(cfg).items()}
    weights.update(
        {k: 1 + 0.1 * rng.normal(size=s).astype(np.float32) for k, s in expected_shapes(cfg).items() if len(s) == 1}
    )

    def kind_of(name: str, w: np.ndarray) -> str:
        return q4_k_m_kind(name, w, cfg.num_layers) if recipe == "Q4_K_M" else recipe

    kinds = write_model_gguf(tmp_path / "m.gguf", cfg, weights, kind_of, meta)
    if recipe == "Q4_K_M":
        assert set(kinds.values()) == {"Q4_K", "Q6_K"}  # 256-wide rows: no fallback needed here
        assert (
            kinds["model.layers.0.self_attn.v_proj.weight"] == "Q6_K" != kinds["model.layers.0.self_attn.q_proj.weight"]
        )
    loaded = load_model(str(tmp_path / "m.gguf"), keep_blocks=True)
    assert loaded.blocks is not None and {n: b.kind for n, b in loaded.blocks.items()} == kinds
    for name, block in loaded.blocks.items():  # Q/K rows un-permuted like the float weights
        assert torch.equal(block.dequantize(), loaded.weights[name]), name
        err = (loaded.weights[name] - torch.from_numpy(weights[name])).abs().max().item()
        assert err <= STEP[block.kind] * np.abs(weights[name]).max(), (name, err)
    base = LlamaModel(loaded.config, loaded.weights)
    want = _logits(base).double()
    monkeypatch.setenv("RADIXCACHE_GGUF_ACTIVATIONS", "float")
    got = _logits(LlamaModel(loaded.config, loaded.weights, quant="gguf", blocks=loaded.blocks)).double()
    assert _rms_error(got, want) < 1e-5
    # int8, each loaded layer: the float64 product of its dequantised weight with the activations rounded as this
    # test rounds them (kquants.quantised_activations), within float32 slack
    x = torch.randn(3, cfg.hidden_size, generator=torch.Generator().manual_seed(5)).numpy()
    seen, _ = quantised_activations(x)
    for name, block in loaded.blocks.items():
        if block.cols != cfg.hidden_size:
            continue
        layer = BlockLinear(block.dequantize(), None, [block], activations="int8")
        w = block.dequantize().double().numpy()
        got = layer(torch.from_numpy(x)).double().numpy()
        assert np.abs(got - seen @ w.T).max() <= 1e-5 * (np.abs(seen) @ np.abs(w).T).max(), name
    # and the whole model: activation rounding moves these random-weight logits by about 2.5% rms whatever the
    # weights' kind (a wrong block, scale or part moves them by order 1)
    monkeypatch.setenv("RADIXCACHE_GGUF_ACTIVATIONS", "int8")
    got = _logits(LlamaModel(loaded.config, loaded.weights, quant="gguf", blocks=loaded.blocks)).double()
    assert 1e-3 < _rms_error(got, want) < 0.05


def _rms_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()
