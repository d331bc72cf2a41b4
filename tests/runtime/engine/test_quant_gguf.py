"""quant="gguf" on SmolLM2 (its Q4_1 / Q8_0 blocks through the block kernels), checked against float32.

- Every kept block tensor dequantises bit-exactly to the float32 weight of the same name (so the Q/K rows of the
  blocks are un-permuted like the float weights).
- The refusals: a gguf LlamaModel without blocks (names keep_blocks), keep_blocks on a Hugging Face directory.
- Greedy answers on FIXED_PROMPTS equal float32's; decode logits stay within a small bound of float32's.
- Engine(loaded, quant="gguf"), with the default kernels (int16-decode), answers the France question, and its
  cache-on run equals a cache-off run: the answer's first token is a near-tie in SmolLM2 (float32 logits "The" 25.33,
  "L" 25.24) that int8 activations at the prompt's last position flip (to llama.cpp's own answer, "L'Étoile, la
  Cité, ..."), so a cached prompt's short tail must not take them (a "-decode" mode gives prefill rows float).
- `gguf_activations` reaches the kernels when the engine builds the model: every block matrix but the output head
  runs the mode asked for (the head float always), an int16-decode or int8-decode engine's decode logits differ
  from float's by that rounding only, and the refusals (an unknown mode, a mode with another weight format, a mode
  for a built model).
- runtime.native.openmp.release_idle_team() can be called repeatedly from any thread; products after it are correct.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.native.openmp import release_idle_team
from radixcache.runtime.quant_eval import FIXED_PROMPTS, greedy_answers

# Under xdist one worker runs this module, so its module-scoped SmolLM2 (blocks kept) loads once, not once per worker.
pytestmark = pytest.mark.xdist_group("quant_gguf")

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
# The gguf weights are the float32 weights (the blocks dequantise to them exactly): only float32 summation order
# differs, in 30 layers and the head. Measured max |logit difference|: 7.0e-5 over a prefill and 8 decode steps
# of 1 row, 9.7e-5 with 3 rows per step; logits are of magnitude ~34. Bound 1e-3: about 10x margin; a wrong block,
# a swapped part or a missing Q/K un-permutation moves logits by order 1.
DECODE_LOGIT_BOUND = 1e-3
PAGE = 16

needs_cc = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="quant='gguf' builds a C kernel: no C compiler here"
)


@pytest.fixture(scope="module")
def smol(smollm2_gguf: Any) -> Any:
    """SmolLM2 with its blocks kept: the session's `smollm2_gguf` (tests/conftest.py), the same model as
    load_model("smollm2", keep_blocks=True) on the weights the worker has loaded already (a load is about 3 s)."""
    return smollm2_gguf


@pytest.fixture(scope="module")
def models(smol: Any, smollm2_fp32: Any) -> dict[str, LlamaModel]:
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("quant='gguf' builds a C kernel: no C compiler here")
    with pytest.MonkeyPatch.context() as mp:  # the float-activation kernel; int8: tests/runtime/native/
        mp.setenv("RADIXCACHE_GGUF_ACTIVATIONS", "float")
        gguf = LlamaModel(smol.config, smol.weights, quant="gguf", blocks=smol.blocks)
    return {"none": smollm2_fp32, "gguf": gguf}  # float32: the session's (tests/conftest.py), the same weights


# ---------------------------------------------------------------------- loading


def test_every_block_tensor_dequantises_to_its_float32_weight(smol: Any) -> None:
    assert smol.blocks, "keep_blocks kept no block tensors"
    assert {b.kind for b in smol.blocks.values()} <= {"Q4_1", "Q8_0"}
    assert any(".self_attn.q_proj." in n for n in smol.blocks) and any(".self_attn.k_proj." in n for n in smol.blocks)
    differ = [n for n, b in smol.blocks.items() if not torch.equal(b.dequantize(), smol.weights[n])]
    assert not differ, f"{len(differ)} block tensors differ from their weights: {differ[:5]}"


def test_a_gguf_model_without_blocks_is_refused(smol: Any) -> None:
    with pytest.raises(ValueError, match="keep_blocks"):  # loaded without them
        LlamaModel(smol.config, smol.weights, quant="gguf", blocks=None)
    with pytest.raises(ValueError, match="quant='none'"):  # loaded with them, and the file has none
        LlamaModel(smol.config, smol.weights, quant="gguf", blocks={})


def test_keep_blocks_on_a_hugging_face_directory_is_refused(tmp_path: Path) -> None:
    from radixcache.runtime.loading import load_model

    cli_conftest = Path(__file__).resolve().parents[2] / "cli" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_cli_fixtures", cli_conftest)
    assert spec is not None and spec.loader is not None
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    directory = fixtures.write_tiny_checkpoint(tmp_path / "tiny")
    assert load_model(str(directory)).blocks is None  # the directory itself loads
    with pytest.raises(ValueError, match="keep_blocks") as err:
        load_model(str(directory), keep_blocks=True)
    assert "GGUF" in str(err.value)


# ---------------------------------------------------------------------- against float32


@pytest.mark.slow
def test_greedy_answers_equal_float32s(smol: Any, models: dict[str, LlamaModel]) -> None:
    """Batches of 3 prompts, so that every decode step goes through the kernel (it takes up to 4 rows)."""
    answers = {}
    for quant, model in models.items():
        engine = Engine(model, tokenizer=smol.tokenizer, kv_memory="64MiB")
        answers[quant] = [r for i in (0, 3) for r in greedy_answers(engine, FIXED_PROMPTS[i : i + 3], 16)]
    assert "Paris" in answers["none"][0].text
    changed = [
        f"{p!r}: float32 {a.text!r} / gguf {b.text!r}"
        for p, a, b in zip(FIXED_PROMPTS, answers["none"], answers["gguf"], strict=True)
        if a.token_ids != b.token_ids
    ]
    assert not changed, "\n".join(changed)


def _decode_logits(model: LlamaModel, prompts: list[list[int]], steps: list[list[int]]) -> torch.Tensor:
    """Prefill each prompt into its own pages, then teacher-forced decode steps for all sequences at once."""
    pages = 4
    pool = model.new_pool(pages * len(prompts), PAGE)
    tables = [list(range(i * pages, (i + 1) * pages)) for i in range(len(prompts))]
    out = []
    for ids, table in zip(prompts, tables, strict=True):
        out.append(model.prefill(ids, 0, table, pool).reshape(-1, model.config.vocab_size)[-1:])
    lengths = [len(p) for p in prompts]
    for tokens in steps:
        lengths = [n + 1 for n in lengths]
        meta = build_decode_meta(tables, lengths, PAGE, model.device)
        out.append(model.decode(tokens, meta, pool))
    return torch.cat(out)


@pytest.mark.slow
def test_decode_logits_stay_near_float32s(smol: Any, models: dict[str, LlamaModel]) -> None:
    gen = torch.Generator().manual_seed(0)
    one = [smol.tokenizer.encode("The capital of France is")]
    one_steps = [[t] for t in torch.randint(100, 40000, (8,), generator=gen).tolist()]
    three = [smol.tokenizer.encode(s) for s in ("Once upon a time", "def main():", "2 + 2 =")]
    three_steps = torch.randint(100, 40000, (3, 3), generator=gen).tolist()
    for prompts, steps in ((one, one_steps), (three, three_steps)):
        want = _decode_logits(models["none"], prompts, steps)
        got = _decode_logits(models["gguf"], prompts, steps)
        diff = (got - want).abs().max().item()
        assert diff < DECODE_LOGIT_BOUND, f"{len(prompts)} rows: max |logit difference| {diff:.3g}"


# ---------------------------------------------------------------------- the engine


@pytest.mark.slow
def test_the_engine_answers_and_its_cache_changes_nothing(smol: Any, models: dict[str, LlamaModel]) -> None:
    on = Engine(smol, quant="gguf", kv_memory="64MiB")  # the loaded model, built by the engine
    assert on.model.quant == "gguf"
    first = on.chat(FRANCE, max_new_tokens=12)
    assert first.text.strip() == "The capital of France is Paris.", first.text
    # the same model as `on` (its default kernels; a model holds no state between passes), without the cache
    off = Engine(on.model, tokenizer=smol.tokenizer, kv_memory="64MiB", enable_cache=False)
    follow = [*FRANCE, {"role": "assistant", "content": first.text}, {"role": "user", "content": "And of Spain?"}]
    for messages in (FRANCE, follow):
        a = on.chat(messages, max_new_tokens=12)
        b = off.chat(messages, max_new_tokens=12)
        assert a.cached_tokens > 0
        assert a.token_ids == b.token_ids, f"cache on {a.text!r} / off {b.text!r}"
    assert on.chat(FRANCE, max_new_tokens=12).token_ids == first.token_ids


def _activations(model: LlamaModel) -> tuple[set[str], str]:
    """(the activations modes of every block matrix but the head, the head's)."""
    linears = [getattr(layer, name) for layer in model.layers for name in ("qkv", "o", "gate_up", "down")]
    layers = {getattr(lin, "activations", "dense") for lin in linears}
    return layers - {"dense"}, model.lm_head.activations


@needs_cc
@pytest.mark.parametrize("mode", [None, "float", "int16-decode", "int16", "int8-decode", "int8", "auto"])
def test_gguf_activations_reach_every_block_matrix_but_the_head(
    smol: Any, monkeypatch: pytest.MonkeyPatch, mode: str | None
) -> None:
    monkeypatch.delenv("RADIXCACHE_GGUF_ACTIVATIONS", raising=False)
    engine = Engine(smol, quant="gguf", gguf_activations=mode, kv_memory="16MiB", mirror_memory=0)
    assert engine.engine_config.gguf_activations == mode
    head = "int16-decode" if mode in (None, "int16-decode", "int16") else "float"  # block_linear.head_activations
    assert _activations(engine.model) == ({mode or "int16-decode"}, head)
    if mode in (None, "int16-decode"):  # SmolLM2's Q4_1 / Q8_0 matrices: float decode rows (no K-quant parts)
        linears = [engine.model.lm_head, *(getattr(layer, n) for layer in engine.model.layers for n in ("qkv", "o"))]
        assert {lin.decode_kernel for lin in linears} == {"float"}
    engine.close()


@needs_cc
@pytest.mark.parametrize(("mode", "low", "high"), [("int16", 1e-5, 0.05), ("int8-decode", 1e-3, 3.0)])
def test_a_decode_mode_moves_decode_logits_by_its_rounding_only(
    smol: Any, models: dict[str, LlamaModel], mode: str, low: float, high: float
) -> None:
    """The mode is live, not only recorded: its engine's decode logits differ from the float kernel's by the
    rounding of each layer's activations (measured 2026-12-05 over these 3 steps, on logits up to 25.7: int8 at
    most 0.82; 16 bits at most 3.4e-3, 257 times finer steps), and by less than a wrong block or scale would move
    them (order 10). "int16", not "int16-decode": SmolLM2's Q4_1 matrices hold no K-quant, so int16-decode gives
    them float decode rows."""
    engine = Engine(smol, quant="gguf", gguf_activations=mode, kv_memory="16MiB", enable_cache=False)
    ids = smol.tokenizer.encode("The capital of France is")
    steps = [[t] for t in (504, 3458, 282)]
    got = _decode_logits(engine.model, [ids], steps)[1:]  # the decode rows (the prefill's row is float in both)
    want = _decode_logits(models["gguf"], [ids], steps)[1:]
    diff = (got - want).abs().max().item()
    assert low < diff < high, diff
    engine.close()


def test_gguf_activations_refusals(smol: Any, models: dict[str, LlamaModel]) -> None:
    with pytest.raises(ValueError, match="gguf_activations must be one of"):
        Engine(smol, quant="gguf", gguf_activations="int4", capacity_blocks=8)
    with pytest.raises(ValueError, match="applies to quant='gguf' only"):
        Engine(smol, gguf_activations="int8-decode", capacity_blocks=8)
    with pytest.raises(ValueError, match="applies to quant='gguf' only"):
        LlamaModel(smol.config, smol.weights, gguf_activations="int8")
    with pytest.raises(ValueError, match="when the engine builds the model"):
        Engine(models["gguf"], quant="gguf", gguf_activations="float", capacity_blocks=8)


# ---------------------------------------------------------------------- OpenMP team release


def _matmul_is_right(seed: int) -> bool:
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randn(300, 200, generator=gen), torch.randn(200, 250, generator=gen)
    return torch.allclose((a @ b).double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)


@needs_cc
def test_release_idle_team_from_any_thread_keeps_results_right(models: dict[str, LlamaModel]) -> None:
    ids = [1, 504, 3458, 282, 4649, 314]

    def logits() -> torch.Tensor:
        pool = models["gguf"].new_pool(1, PAGE)
        out = models["gguf"].prefill(ids[:3], 0, [0], pool, all_logits=True)  # 3 rows: the block kernel
        return out

    before = logits()
    assert _matmul_is_right(0)
    for _ in range(3):
        assert release_idle_team() in (True, False)
    assert _matmul_is_right(1)
    torch.testing.assert_close(logits(), before, rtol=0, atol=0)

    seen: list[Any] = []

    def worker() -> None:
        try:
            seen.append(release_idle_team())  # a thread that has no team yet
            seen.append(_matmul_is_right(2))
            seen.extend(release_idle_team() for _ in range(3))
            seen.append(_matmul_is_right(3))
            seen.append(torch.equal(logits(), before))
        except BaseException as exc:  # surfaced in the main thread
            seen.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(120)
    assert not thread.is_alive()
    assert [s for s in seen if isinstance(s, BaseException)] == []
    assert seen[1] and seen[5] and seen[6], seen
    assert release_idle_team() in (True, False)
    assert _matmul_is_right(4)
