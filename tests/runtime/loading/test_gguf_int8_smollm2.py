"""SmolLM2 through the int8-activation kernel (runtime/native/qdot.c), against the float-activation one and fp32:
its own Q4_1 file, and the same weights re-encoded as a Q4_K_M-like file (tests/runtime/loading/gguf_files.py:
Q4_K / Q6_K where rows are whole super-blocks (ffn_down), llama.cpp's fallbacks Q5_0 / Q8_0 for the 576-wide
rows, as llama.cpp's own Q4_K_M of this model has).

Perplexity (radixcache.runtime.quant_eval.perplexity, one window of the first 512 tokens of the GPL-3 text: every
token after the first scored once, as with the windows of 256 every 128 used until 2026-12-07, which prefilled
768 tokens for the same 511 scores; chunks of 8 so that every product goes through the block kernel; the fp32
reference, which has no block kernel, in one chunk: 21.0043716 against 21.0043743 in chunks of 8 with the old
windows, in half the time) and greedy answers on quant_eval.FIXED_PROMPTS. "int8" here is qdot.c in every pass
(prefill too, so that perplexity measures it); the output head takes float activations in every mode
(model.llama). Measured 2026-12-07 (one thread): perplexity fp32 18.833, float 18.833, int8 18.729 (with the old
windows on 2026-12-04, threads 2: fp32 21.004, float 21.004, int8 20.979 in the morning and 21.031 at 17:35 UTC,
after the day's int8 kernel changes); greedy answers equal to the float path's in 5 of 6, both answering "The
capital of France is Paris."; int8 lists the primary colours on separate lines. (With the head on int8 too, an
earlier run answered France "L'Étoile, la Cité, la Nation", llama.cpp's own answer on this file: the first token
is a near-tie, float32 logits "The" 25.33 against "L" 25.24.) The Q4_K_M-like file (this simple encoder,
re-quantising the Q4_1 values): perplexity float 20.190, int8 20.113 (fp32 18.833; with the old windows float
22.844, int8 22.753 to 22.856 against fp32 21.004); 5 of 6 greedy answers equal between the two kernels, both
answering France with "L'Étoile de la Cité, ..." (the file's weights, not the kernel)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.loading import load_model
from radixcache.runtime.loading.gguf import GGUFFile
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.quant_eval import FIXED_PROMPTS, greedy_answers, perplexity
from tests.runtime.loading.gguf_files import q4_k_m_kind, write_model_gguf

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # three SmolLM2 models scored and asked; a loaded 2-core machine takes minutes
    pytest.mark.xdist_group("quant_gguf"),
    pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler here"),
]
TEXT = Path("/usr/share/common-licenses/GPL-3")


@pytest.fixture(scope="module")
def smollm2_q4_1(smollm2_gguf: Any) -> Any:
    """SmolLM2's own Q4_1 file with its blocks: the first test's block-kernel models, and the fp32 weights of both
    tests (the second re-encodes them as a Q4_K_M-like file). The session's `smollm2_gguf` (tests/conftest.py: the
    same model as load_model(smollm2_path, keep_blocks=True), its weights and tokenizer those of the session's
    `smollm2`, which the worker has usually loaded already for other tests): no second copy of the weights."""
    return smollm2_gguf


def _models(loaded: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, LlamaModel]:
    """The two block-kernel models of `loaded`."""
    models = {}
    for kernel in ("float", "int8"):
        monkeypatch.setenv("RADIXCACHE_GGUF_ACTIVATIONS", kernel)
        models[kernel] = LlamaModel(loaded.config, loaded.weights, quant="gguf", blocks=loaded.blocks)
    return models


_FP32_PERPLEXITY: dict[str, float] = {}  # SmolLM2's fp32 score, the same in both tests: computed once per process


def _perplexities(models: dict[str, LlamaModel], tokenizer: Any, fp32: LlamaModel) -> dict[str, float]:
    """Each model's perplexity, and "fp32": `fp32`'s (the session's float32 SmolLM2, tests/conftest.py: the weights
    both tests start from, so it is built by neither), scored once per process."""
    if not TEXT.exists():
        pytest.skip(f"{TEXT} (the held-out text) is not on this machine")
    ids = tokenizer.encode(TEXT.read_text())[:512]
    if "fp32" not in _FP32_PERPLEXITY:
        _FP32_PERPLEXITY["fp32"] = perplexity(fp32, ids, window=512, stride=256, chunk_size=512)
    out = {"fp32": _FP32_PERPLEXITY["fp32"]}
    for k, m in models.items():
        out[k] = perplexity(m, ids, window=512, stride=256, chunk_size=8)
    print("perplexity", {k: round(v, 3) for k, v in out.items()})  # shown with -s
    return out


def _answers(models: dict[str, LlamaModel], tokenizer: Any) -> dict[str, list[Any]]:
    """Each model's greedy answers, on one thread: greedy outputs do not change with the thread count
    (tests/runtime/engine/test_thread_changes.py), and two threads beside the other busy xdist worker on a 2-core
    machine wait at every barrier (both models' answers took 30 to 33 s on two threads there, 3 to 7 s on one)."""
    out = {}
    for name, model in models.items():
        engine = Engine(model, tokenizer=tokenizer, kv_memory="64MiB", threads=1, thread_policy="fixed")
        out[name] = [r for i in (0, 3) for r in greedy_answers(engine, FIXED_PROMPTS[i : i + 3], 16)]
    return out


def test_smollm2_q4_1_int8_perplexity_and_answers_match_the_float_path(
    smollm2_q4_1: Any, smollm2_fp32: LlamaModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = smollm2_q4_1
    models = _models(loaded, monkeypatch)
    ppl = _perplexities(models, loaded.tokenizer, smollm2_fp32)
    assert abs(ppl["float"] / ppl["fp32"] - 1) < 1e-3, ppl  # the same weights, another summation order
    assert abs(ppl["int8"] / ppl["float"] - 1) < 0.02, ppl  # activation rounding: measured -0.12%
    answers = _answers(models, loaded.tokenizer)
    print({k: [a.text for a in v] for k, v in answers.items()})
    same = [a.token_ids == b.token_ids for a, b in zip(answers["float"], answers["int8"], strict=True)]
    # Measured 4 and 5 of 6 equal with the head on int8, 5 of 6 with it on float (the dense prefill kernels' choice
    # varies from run to run): at least half.
    assert sum(same) >= 3, [(a.text, b.text) for a, b in zip(answers["float"], answers["int8"], strict=True)]
    # the output head on float activations keeps the France answer (on int8 it said "L'Étoile, ...")
    assert "Paris" in answers["float"][0].text and "Paris" in answers["int8"][0].text, answers["int8"][0].text
    assert "4" in answers["int8"][4].text


def test_smollm2_as_a_q4_k_m_file_loads_answers_and_scores_near_fp32(
    smollm2_path: str, smollm2_q4_1: Any, smollm2_fp32: LlamaModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = smollm2_q4_1  # its fp32 weights (dequantised from the Q4_1 blocks) are what gets re-encoded
    with GGUFFile(smollm2_path) as f:
        tokenizer_meta = {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.")}
    weights = {k: v.numpy() for k, v in original.weights.items()}
    cfg = original.config
    kinds = write_model_gguf(
        tmp_path / "q4km.gguf", cfg, weights, lambda n, w: q4_k_m_kind(n, w, cfg.num_layers), tokenizer_meta
    )
    assert set(kinds.values()) == {"Q4_K", "Q6_K", "Q5_0", "Q8_0"}  # ffn_down 1536 wide, the rest 576
    loaded = load_model(str(tmp_path / "q4km.gguf"), keep_blocks=True)
    assert loaded.blocks is not None and {n: b.kind for n, b in loaded.blocks.items()} == kinds
    models = _models(loaded, monkeypatch)
    ppl = _perplexities(models, loaded.tokenizer, smollm2_fp32)  # fp32: the source weights
    assert ppl["float"] / ppl["fp32"] < 1.10 and ppl["int8"] / ppl["fp32"] < 1.12, ppl
    answers = _answers(models, loaded.tokenizer)
    print({k: [a.text for a in v] for k, v in answers.items()})
    for kernel, got in answers.items():
        assert "4" in got[4].text and "Shakespeare" in got[5].text, (kernel, [a.text for a in got])
