"""Fixtures for structured output and tools in the engine: the tiny checkpoint (its real byte-level tokenizer and
ChatML template, random weights) in float64, so that batched and lone runs give equal tokens. The tools and schemas
are tests/tiny_tools.py's, shared with the server's tests: every sentence is short (bounded integers, enums,
strings with maxLength, arrays with maxItems), so a random model under the grammar always ends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime import Engine
from tests.tiny_tools import SCHEMAS, TOOL_SCHEMAS, TOOLS, response_format

__all__ = ["PAGE", "SCHEMAS", "TOOLS", "TOOL_SCHEMAS", "make_engine", "parsed", "response_format"]

PAGE = 16


def parsed(text: str) -> Any:
    return json.loads(text)


def make_engine(model: Path, **kw: Any) -> Engine:
    options: dict[str, Any] = {"capacity_blocks": 256, "page_size": PAGE, "dtype": "float64", "threads": 1}
    options.update(kw)
    return Engine(str(model), **options)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.cli.conftest import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("structured") / "tiny")


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Iterator[Engine]:
    with make_engine(tiny_dir) as e:
        yield e
        assert e.check()["locked_blocks"] == 0
