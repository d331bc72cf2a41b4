"""quant="gguf" on a GGUF file whose matrices are all unquantised (F32, F16: a `model-f16.gguf` as llama.cpp's
converter writes it): the engine said to load the file with load_model(..., keep_blocks=True), which it had done.
It now says the file holds no quantised blocks and what to run instead."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from radixcache.runtime.engine.engine import Engine
from radixcache.runtime.loading import load_model
from radixcache.runtime.model.llama import LlamaModel
from tests.runtime.loading.test_gguf_model import random_weights, tiny_config, write_tiny_gguf

needs_cc = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler here")


@needs_cc
@pytest.mark.parametrize("kind", ["F32", "F16"])
def test_quant_gguf_on_a_file_without_blocks_says_so(kit, tmp_path, kind):
    cfg = tiny_config(kit)
    path = tmp_path / f"model-{kind.lower()}.gguf"
    write_tiny_gguf(kit, path, cfg, random_weights(cfg), quant=kind)
    message = "this model's file has none: its matrices are stored unquantised .*; run it with quant='none'"
    with pytest.raises(ValueError, match=message):
        Engine(str(path), quant="gguf", kernels="fixed")
    loaded = load_model(path, keep_blocks=True)
    assert loaded.blocks == {}
    with pytest.raises(ValueError, match=message):
        LlamaModel(loaded.config, loaded.weights, quant="gguf", blocks=loaded.blocks)
    # quant='none' runs it, as the message says
    engine = Engine(str(path), kernels="fixed")
    try:
        assert len(engine.generate("hello", max_new_tokens=2, temperature=0.0).token_ids) == 2
    finally:
        engine.close()


@needs_cc
def test_a_model_built_without_blocks_is_still_told_to_keep_them(kit):
    cfg = tiny_config(kit)
    loaded_weights = {k: torch.from_numpy(v) for k, v in random_weights(cfg).items()}
    with pytest.raises(ValueError, match=r"load a GGUF model with load_model\(\.\.\., keep_blocks=True\)"):
        LlamaModel(cfg, loaded_weights, quant="gguf")
