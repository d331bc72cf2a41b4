"""The grammar vocabulary (every token's bytes, ~0.4 s for SmolLM2) is built on a thread the engine starts, not by
the first request that has a grammar: that request's time to first token carried the whole build, and its size told
a tenant whether anyone had sent a grammar before. A request that comes while the build runs waits for what is left
of it; requests without a grammar never wait; a build that fails fails the structured requests alone."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import radixcache.runtime.engine.structured as structured
from tests.runtime.structured.conftest import SCHEMAS, make_engine, response_format


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """`build_vocab` held until `gate` is set, recording the threads it ran on."""
    real = structured.build_vocab
    state: dict[str, Any] = {"gate": threading.Event(), "entered": threading.Event(), "threads": []}

    def build(*args: Any, **kwargs: Any) -> Any:
        state["threads"].append(threading.current_thread())
        state["entered"].set()
        state["gate"].wait(60)
        if state.get("fail"):
            raise state["fail"] if isinstance(state["fail"], BaseException) else ValueError("no EOS token")
        return real(*args, **kwargs)

    monkeypatch.setattr(structured, "build_vocab", build)
    yield state
    state["gate"].set()


def test_the_vocabulary_is_built_at_start_off_the_request_path(tiny_dir: Path, gated: dict[str, Any]) -> None:
    with make_engine(tiny_dir) as engine:
        # The build thread is started by the engine; on a loaded machine it may not have reached the build yet.
        assert gated["entered"].wait(60)
        assert len(gated["threads"]) == 1 and gated["threads"][0] is not threading.current_thread()
        plain = engine.generate("plain", 6, ignore_eos=True)  # served while the build is held
        assert len(plain.token_ids) == 6
        rf = response_format("flags")
        handles: list[Any] = []
        caller = threading.Thread(target=lambda: handles.append(engine.submit("x", 80, response_format=rf)))
        caller.start()
        caller.join(0.5)
        assert caller.is_alive() and not handles  # waits for what is left of the build
        gated["gate"].set()
        caller.join(60)
        r = handles[0].result(60)
        assert r.finish_reason == "stop"
        jsonschema.validate(json.loads(r.text), SCHEMAS["flags"])
        assert len(gated["threads"]) == 1  # built once, never again by a request
        assert engine.check()["locked_blocks"] == 0


def test_a_failed_build_fails_the_structured_requests_alone(tiny_dir: Path, gated: dict[str, Any]) -> None:
    gated["fail"] = True
    gated["gate"].set()
    with make_engine(tiny_dir) as engine:
        for _ in range(2):
            with pytest.raises(ValueError, match="grammar vocabulary: no EOS token"):
                engine.generate("x", 8, response_format={"type": "json_object"})
        assert len(engine.generate("plain", 4, ignore_eos=True).token_ids) == 4
        assert engine.check()["locked_blocks"] == 0


class PanicException(BaseException):
    """What pyo3 raises for a Rust panic (llguidance's): a BaseException, not an Exception."""


def test_a_build_that_panics_fails_the_structured_requests_with_a_named_error(
    tiny_dir: Path, gated: dict[str, Any]
) -> None:
    gated["fail"] = PanicException("index out of bounds: the len is 3 but the index is 7")
    gated["gate"].set()
    with make_engine(tiny_dir) as engine:
        for _ in range(2):  # each request is told why, not an AssertionError
            with pytest.raises(ValueError, match="grammar vocabulary: index out of bounds") as info:
                engine.generate("x", 8, response_format={"type": "json_object"})
            assert isinstance(info.value.__cause__, PanicException)
        assert len(engine.generate("plain", 4, ignore_eos=True).token_ids) == 4
        assert engine.check()["locked_blocks"] == 0


def test_a_later_engine_loads_the_vocabulary_kept_by_the_first(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import radixcache.runtime.grammar.vocab_cache as vocab_cache

    monkeypatch.setenv(vocab_cache.ENV, str(tmp_path / "vocab"))
    real, reads = vocab_cache.token_table, []
    monkeypatch.setattr(vocab_cache, "token_table", lambda tok: reads.append(tok) or real(tok))
    rf = response_format("flags")
    texts = []
    for _ in range(2):
        with make_engine(tiny_dir) as engine:
            r = engine.generate("x", 80, response_format=rf, seed=3, temperature=0.8)
            assert r.finish_reason == "stop"
            jsonschema.validate(json.loads(r.text), SCHEMAS["flags"])
            texts.append(r.text)
    assert len(reads) == 1  # the second engine read no token: its table came from the file
    assert [p.name.startswith("vocab-") for p in (tmp_path / "vocab").iterdir()] == [True]
    assert texts[0] == texts[1]  # the same masks, so the same sampled output


def test_a_cache_folder_that_cannot_be_written_fails_nothing(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import radixcache.runtime.grammar.vocab_cache as vocab_cache

    (tmp_path / "file").write_text("")
    monkeypatch.setenv(vocab_cache.ENV, str(tmp_path / "file" / "vocab"))  # no folder can be made there
    with make_engine(tiny_dir) as engine:
        r = engine.generate("x", 80, response_format=response_format("flags"))
        jsonschema.validate(json.loads(r.text), SCHEMAS["flags"])
        assert engine.check()["locked_blocks"] == 0
