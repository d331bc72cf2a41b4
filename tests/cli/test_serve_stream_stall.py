"""serve --stream-stall-timeout: create_app's stream_stall_timeout (a stream whose client stopped reading is given up
after it) had no flag, so a server could only run with 60 s. The flag reaches the app; a value no timeout can be
(nan, inf, 0, negative, not a number) is a usage error before the model loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import radixcache.runtime.server as server
from radixcache.cli.main import main
from radixcache.runtime.server.http_common import STREAM_STALL_S


class _Made(Exception):
    """Raised where the app would be made: the test ends there, before uvicorn runs."""


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def capture(engine: Any, name: str, **kwargs: Any) -> None:
        seen.update(kwargs)
        raise _Made

    monkeypatch.setattr(server, "create_app", capture)
    return seen


@pytest.mark.parametrize(("args", "expected"), [([], STREAM_STALL_S), (["--stream-stall-timeout", "2.5"], 2.5)])
def test_the_stall_timeout_reaches_the_app(tiny_model_dir: Path, made: dict[str, Any], args: list, expected) -> None:
    result = CliRunner().invoke(main, ["serve", "--model", str(tiny_model_dir), "--port", "0", "--debug", *args])
    assert isinstance(result.exception, _Made), result.output
    assert made.get("stream_stall_timeout", STREAM_STALL_S) == expected


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "soon"])
def test_a_stall_timeout_no_stream_could_take_is_a_usage_error(tmp_path: Path, value: str) -> None:
    result = CliRunner().invoke(main, ["serve", "--model", str(tmp_path / "no-model"), "--stream-stall-timeout", value])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--stream-stall-timeout'" in result.output
