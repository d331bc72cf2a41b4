"""serve --max-model-len over the model's context is a usage error, found from the model's config before its weights
load; it was clamped to the context without a word (and /v1/models reported the clamped figure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import radixcache.cli.engine_options as engine_options
from radixcache.cli.main import main


class _Loaded(Exception):
    """Raised where the weights would load: the test ends there."""


@pytest.fixture
def no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise _Loaded

    monkeypatch.setattr(engine_options, "load_engine_model", refuse)


def test_a_max_model_len_over_the_context_is_refused_before_the_weights_load(
    tiny_model_dir: Path, no_weights: None
) -> None:
    args = ["serve", "--model", str(tiny_model_dir), "--port", "0", "--max-model-len", "4097"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "'--max-model-len'" in result.output and "over the model's context of 4,096 tokens" in result.output


def test_a_max_model_len_within_the_context_goes_on_to_load_the_model(tiny_model_dir: Path, no_weights: None) -> None:
    args = ["serve", "--model", str(tiny_model_dir), "--port", "0", "--max-model-len", "4096", "--debug"]
    result = CliRunner().invoke(main, args)
    assert isinstance(result.exception, _Loaded), result.output
