"""--admission on replay, chat and serve: the choices are radixcache.policy.admission's policies, the name reaches the
Engine, a bad one is refused before the model loads, and `radixcache chat` sends every turn with
retain="conversation"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixcache.cli.main import main
from radixcache.policy.admission import ADMISSION_POLICIES, AdmitAll


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every Engine the CLI builds records its admission policy, and every request its `retain`."""
    import radixcache.runtime.engine.engine as engine_module

    seen: dict[str, list[Any]] = {"admission": [], "retain": []}

    class Spy(engine_module.Engine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            seen["admission"].append(self.admission)

        def submit(self, prompt: Any, max_new_tokens: int = 64, **kwargs: Any) -> Any:
            options = kwargs.get("options")  # a session or the replay sends RequestOptions, others keywords
            seen["retain"].append(options.retain if options is not None else kwargs.get("retain"))
            return super().submit(prompt, max_new_tokens, **kwargs)

    monkeypatch.setattr(engine_module, "Engine", Spy)
    return seen


@pytest.mark.parametrize("command", ["replay", "serve", "chat"])
def test_a_bad_admission_name_is_refused_before_the_model_loads(runner, command: str) -> None:
    result = runner.invoke(main, [command, "--model", "/nonexistent/model", "--admission", "oracle"])
    assert result.exit_code == 2, result.output
    assert "--admission" in result.stderr and "oracle" in result.stderr
    for name in ADMISSION_POLICIES:
        assert name in result.stderr, "the error lists the choices"
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", ["replay", "serve", "chat"])
def test_an_admission_that_needs_another_eviction_policy_is_refused_before_the_model_loads(
    runner, command: str
) -> None:
    result = runner.invoke(main, [command, "--model", "/nonexistent/model", "--admission", "reuse", "--policy", "lru"])
    assert result.exit_code == 2, result.output
    assert "--admission" in result.stderr and "reuse" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", ["replay", "serve", "chat"])
def test_help_lists_the_admission_policies(runner, command: str) -> None:
    result = runner.invoke(main, [command, "--help"])
    assert result.exit_code == 0 and "--admission" in result.stdout
    assert all(name in result.stdout for name in ADMISSION_POLICIES)


def test_chat_sends_every_turn_as_a_live_conversation(runner, tiny_model_dir: Path, spy: dict) -> None:
    args = ["chat", "--model", str(tiny_model_dir), "--max-tokens", "3", "--admission", "all"]
    result = runner.invoke(main, args, input="hello\nand again\n/reset\nonce more\n")
    assert result.exit_code == 0, result.output
    assert len(spy["admission"]) == 1 and isinstance(spy["admission"][0], AdmitAll)
    assert spy["retain"] == ["conversation"] * 3, "every turn, also after /reset"


def test_replay_passes_the_admission_policy_to_the_engine(runner, tiny_model_dir: Path, spy: dict) -> None:
    args = ["replay", "--model", str(tiny_model_dir), "--limit", "1", "--max-tokens", "2", "--admission", "all"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert spy["admission"] and all(isinstance(a, AdmitAll) for a in spy["admission"])
    assert set(spy["retain"]) <= {None}, "a replay measures the policy: it sends no hint"


def test_serve_passes_the_admission_policy_to_the_engine(
    runner, tiny_model_dir: Path, spy: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    import radixcache.runtime.engine.engine as engine_module

    class Stop(Exception):
        """Raised once the engine is built: the test ends before a server would start."""

    class Stopping(engine_module.Engine):  # the spy's Engine, then stop
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            raise Stop

    monkeypatch.setattr(engine_module, "Engine", Stopping)
    args = ["serve", "--model", str(tiny_model_dir), "--port", "0", "--admission", "all", "--debug"]
    result = runner.invoke(main, args)
    assert isinstance(result.exception, Stop), result.output
    assert len(spy["admission"]) == 1 and isinstance(spy["admission"][0], AdmitAll)


def test_replay_runs_the_learned_admission_with_its_eviction_policy(runner, tiny_model_dir: Path) -> None:
    args = ["replay", "--model", str(tiny_model_dir), "--limit", "2", "--max-tokens", "3"]
    result = runner.invoke(main, [*args, "--policy", "reuse", "--admission", "reuse"])
    assert result.exit_code == 0, result.output
    assert "hit rate" in result.stdout
