"""Fixtures for the tool tests: the tiny checkpoint's byte-level tokenizer (ChatML, no tools in its template),
and three tools (SmolLM2's tokenizer: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime.tools import normalize_tools
from tests.smollm2_tools import TOOLS as SMOLLM2_TOOLS

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
