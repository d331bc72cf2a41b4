"""The attention paths that only run off the CPU, run here on the CPU against independent expectations.

On a GPU a prefill chunk takes the masked path (`causal_mask`, the whole sequence gathered from the pool, one SDPA
call) and a one-sequence decode takes the gather path; the CPU takes the split flash path and in-place page runs.
Which path runs is decided by the device alone (`uses_split_prefill`, `reads_pages_in_place`), so these tests
patch only that decision and run the model's own code for the rest, compared with a mask built naively and with
the plain reference forward (radixcache.runtime.model.reference).
"""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime.model import attention, chunk_rows
from radixcache.runtime.model.attention import (
    build_decode_meta,
    causal_mask,
    reads_pages_in_place,
    uses_split_prefill,
)
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.model.reference import reference_logits
from radixcache.runtime.testing import RandomModel
from tests.runtime.engine import test_forward_batch as forward_batch
from tests.runtime.engine import test_model_vs_reference as model_vs_reference

TOL = 1e-4
OFF_CPU = ["cuda", "cuda:1", "mps", "meta"]  # constructing a torch.device touches no GPU


def tokens(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture
def masked(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Prefill takes the masked path on the CPU, as off it; counts the calls so a test proves which path ran."""
    calls = {"masked": 0}
    plain = chunk_rows.prefill_attention

    def counting(*args: torch.Tensor) -> torch.Tensor:
        calls["masked"] += 1
        return plain(*args)

    def refuse(*args: object) -> torch.Tensor:
        raise AssertionError("the split (CPU) prefill ran where the masked one should")

    monkeypatch.setattr(chunk_rows, "uses_split_prefill", lambda device: False)
    monkeypatch.setattr(chunk_rows, "prefill_attention", counting)
    monkeypatch.setattr(chunk_rows, "split_prefill_attention", refuse)
    return calls


# ---------------------------------------------------------------------------------------------- the decisions


def test_the_cpu_splits_prefill_and_reads_pages_in_place() -> None:
    assert uses_split_prefill(torch.device("cpu")) and reads_pages_in_place(torch.device("cpu"))


@pytest.mark.parametrize("device", OFF_CPU)
def test_every_other_device_masks_prefill_and_gathers_decode(device: str) -> None:
    assert not uses_split_prefill(torch.device(device))
    assert not reads_pages_in_place(torch.device(device))


def test_decode_metadata_off_the_cpu_has_no_page_runs() -> None:
    """Built on the meta device (shapes only, no GPU): the same tables and slots as on the CPU, and no runs."""
    cpu = build_decode_meta([[5, 6]], [20], 16, torch.device("cpu"))
    off = build_decode_meta([[5, 6]], [20], 16, torch.device("meta"))
    assert cpu.runs is not None and off.runs is None
    assert off.block_tables.shape == cpu.block_tables.shape and off.slots.shape == cpu.slots.shape


# ---------------------------------------------------------------------------------------------- the mask


def naive_mask(start: int, new: int, total: int, group: int) -> list[list[float]]:
    """Row g * new + t: query t of head-group member g, at position start + t, sees keys 0 .. start + t."""
    row = [[0.0 if key <= start + t else float("-inf") for key in range(total)] for t in range(new)]
    return [r for _ in range(group) for r in row]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("start", "new", "group"), [(0, 1, 1), (0, 7, 3), (5, 3, 2), (16, 1, 4), (13, 9, 1)])
def test_causal_mask_is_the_naive_mask_in_the_models_dtype(
    dtype: torch.dtype, start: int, new: int, group: int
) -> None:
    mask = causal_mask(start, new, start + new, group, torch.device("cpu"), dtype)
    assert mask.dtype == dtype and mask.shape == (group * new, start + new)
    assert mask.float().tolist() == naive_mask(start, new, start + new, group)


# ---------------------------------------------------------------------------------------------- the masked prefill


# The masked path must pass the very tests the CPU's split path passes: they are run here, not copied.


@pytest.mark.parametrize("page", [1, 5, 16])
@pytest.mark.parametrize(("split", "chunk"), [(0, 512), (0, 7), (19, 512), (32, 6)])
def test_masked_prefill_over_a_cached_prefix_matches_reference(
    tiny_variant: RandomModel, masked: dict[str, int], page: int, split: int, chunk: int
) -> None:
    model_vs_reference.test_prefill_over_a_cached_prefix_matches_reference(tiny_variant, page, split, chunk)
    assert masked["masked"] > 0


def test_masked_prefill_in_float64_is_the_reference_function(tiny: RandomModel, masked: dict[str, int]) -> None:
    """The mask is built in the model's dtype: in float64 both sides agree far below the float32 tolerance."""
    model_vs_reference.test_float64_paged_forward_is_the_reference_function(tiny)
    assert masked["masked"] > 0


@pytest.mark.parametrize("page", [1, 4, 16])
@pytest.mark.parametrize("with_decodes", [False, True])
def test_a_mixed_pass_with_masked_prefills_equals_each_sequence_alone(
    tiny_variant: RandomModel, masked: dict[str, int], page: int, with_decodes: bool
) -> None:
    """Chunks (one fresh, one over a cached prefix, one of a single token) and decodes in one pass: each chunk
    gathers its own sequence and masks with its own offset, whatever shares the pass."""
    forward_batch.test_a_mixed_pass_equals_each_sequence_alone(tiny_variant, page, with_decodes)
    assert masked["masked"] > 0


# ---------------------------------------------------------------------------------------------- the gather decode


@pytest.mark.parametrize("page", [1, 4, 16])
def test_one_sequence_decoding_by_the_gather_path_matches_reference(
    tiny: RandomModel, monkeypatch: pytest.MonkeyPatch, page: int
) -> None:
    """Off the CPU a lone sequence's decode gathers its pages (no runs); its logits are the reference's."""
    monkeypatch.setattr(attention, "reads_pages_in_place", lambda device: False)
    cfg = tiny.config
    model = LlamaModel(cfg, tiny.weights)
    pool = model.new_pool(32, page)
    ids = tokens(29, cfg.vocab_size, seed=page)
    table = list(range(-(-29 // page)))  # consecutive ids: on the CPU this would be one in-place run
    model.prefill(ids[:-3], 0, table, pool)
    for n in (27, 28, 29):
        meta = build_decode_meta([table], [n], page, model.device)
        assert meta.runs is None
        got = model.decode([ids[n - 1]], meta, pool)
        assert (got[0] - reference_logits(cfg, tiny.weights, ids[:n])[-1]).abs().max().item() < TOL
