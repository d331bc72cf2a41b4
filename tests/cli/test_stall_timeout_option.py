"""`--stall-timeout` of `serve` and `replay` with `--replicas`: ReplicaCluster's `stall_timeout` (a replica whose engine
loop has had work and finished no step for that long counts as dead before a re-send) was not reachable from the
command line. Checked in process: ReplicaCluster is a stand-in that records its arguments, so no Ray starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.runtime.cluster.resend import STALL_TIMEOUT_S


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments each ReplicaCluster the command starts is given (it stops the command there)."""
    calls: list[dict[str, Any]] = []

    def cluster(path: str, replicas: int, **kwargs: Any) -> None:
        calls.append(kwargs)
        raise RuntimeError("the replicas would start here")

    monkeypatch.setattr("radixcache.runtime.cluster.cluster.ReplicaCluster", cluster)
    monkeypatch.setattr("radixcache.runtime.loading.resolve_model_path", lambda model: model)
    return calls


def _serve(*args: str) -> Any:
    return CliRunner().invoke(main, ["serve", "--model", "m", "--port", "0", *args])


@pytest.mark.parametrize(("given", "expected"), [((), STALL_TIMEOUT_S), (("--stall-timeout", "2.5"), 2.5)])
def test_serve_hands_the_stall_timeout_to_the_replica_cluster(started, given, expected) -> None:
    result = _serve("--replicas", "2", *given)
    assert [call["stall_timeout"] for call in started] == [expected], result.output


def test_replay_hands_the_stall_timeout_to_the_replica_cluster(
    started, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path
) -> None:
    args = ["replay", "--model", str(tiny_model_dir), "--replicas", "2", "--limit", "1", "--stall-timeout", "300"]
    result = CliRunner().invoke(main, args)
    assert [call["stall_timeout"] for call in started] == [300.0], result.output


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_stall_timeout_that_is_no_positive_number_of_seconds_is_refused_naming_it(started, value: str) -> None:
    result = _serve("--replicas", "2", "--stall-timeout", value)
    assert result.exit_code == 2 and "--stall-timeout" in result.output, result.output
    assert started == []


def test_a_stall_timeout_without_replicas_is_refused(started) -> None:
    result = _serve("--stall-timeout", "5")
    assert result.exit_code == 2 and "--stall-timeout: only with --replicas N" in result.output, result.output
    assert started == []


@pytest.mark.parametrize("command", ["serve", "replay"])
def test_the_help_names_the_stall_timeout_and_its_default(command: str) -> None:
    out = CliRunner().invoke(main, [command, "--help"], terminal_width=200).output
    assert "--stall-timeout SECONDS" in out and f"[default: {STALL_TIMEOUT_S:g}]" in out
