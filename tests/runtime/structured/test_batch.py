"""Constrained requests in the batch, in hostile orders: requests arriving while others decode (constrained and
not) give exactly their outputs alone; fork and n samples each follow their own grammar state; a preempted
constrained request resumes with its state and gives its output alone; a stream cancelled mid-way leaves nothing
locked; a malformed schema is a clear error before anything is queued and the engine keeps serving; a grammar that
fails mid-decode (its accept, or its mask) fails that request alone; rows without a grammar are passed on as
they are."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.engine import structured
from radixcache.runtime.grammar import GrammarError, GrammarSpec
from radixcache.runtime.grammar.masks import make_executor
from radixcache.runtime.testing import hold_engine_loop
from tests.runtime.structured.conftest import SCHEMAS, make_engine, response_format


@pytest.fixture(scope="module")
def alone_engine(tiny_dir: Path) -> Any:
    with make_engine(tiny_dir) as e:
        yield e


def wait_for_tokens(handle: Any, n: int) -> None:
    deadline = time.monotonic() + 60
    while len(handle.request.output_ids) < n and not handle.done():
        assert time.monotonic() < deadline
        time.sleep(0.002)


REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("free one", {"max_new_tokens": 50, "ignore_eos": True}),
    ("json one", {"max_new_tokens": 120, "response_format": response_format("flags")}),
    ("free two", {"max_new_tokens": 30, "ignore_eos": True, "temperature": 0.8, "seed": 3}),
    ("json two", {"max_new_tokens": 120, "response_format": response_format("nested"), "temperature": 1.0, "seed": 5}),
    ("regex", {"max_new_tokens": 20, "grammar": GrammarSpec.regex("[a-c]{2,6}!")}),
    ("free three", {"max_new_tokens": 25, "ignore_eos": True, "repetition_penalty": 1.3}),
]


def test_requests_arriving_while_others_decode_give_their_outputs_alone(engine: Engine, alone_engine: Engine) -> None:
    want = [alone_engine.generate(p, **kw) for p, kw in REQUESTS]
    handles = []
    for p, kw in REQUESTS:  # each arrives once the one before it has decoded a few tokens
        handles.append(engine.submit(p, **kw))
        wait_for_tokens(handles[-1], 3)
    got = [h.result(60) for h in handles]
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    for (_, kw), g in zip(REQUESTS, got, strict=True):
        if "response_format" in kw:
            assert g.finish_reason == "stop"
            json.loads(g.text)


def test_a_batch_queued_together_gives_the_outputs_alone(engine: Engine, alone_engine: Engine) -> None:
    want = [alone_engine.generate(p, **kw) for p, kw in REQUESTS]
    release = hold_engine_loop(engine)
    try:
        handles = [engine.submit(p, **kw) for p, kw in REQUESTS]
    finally:
        release()
    assert [h.result(60).token_ids for h in handles] == [w.token_ids for w in want]


def test_fork_branches_each_follow_their_own_grammar(engine: Engine, alone_engine: Engine) -> None:
    rf = response_format("nested")
    branches = engine.fork("shared prefix for all branches", 4, 160, response_format=rf, temperature=1.1, seed=20)
    for i, r in enumerate(branches):
        jsonschema.validate(json.loads(r.text), SCHEMAS["nested"])
        alone = alone_engine.generate(
            "shared prefix for all branches", 160, response_format=rf, temperature=1.1, seed=20 + i
        )
        assert r.token_ids == alone.token_ids
    assert len({r.text for r in branches}) > 1


def test_n_samples_of_one_prompt_each_validate(engine: Engine) -> None:
    rf = response_format("choice")
    each = [{"seed": s} for s in range(6)]
    handles = engine.submit_group(["same prompt"] * 6, 80, each=each, response_format=rf, temperature=1.5)
    for h in handles:
        jsonschema.validate(json.loads(h.result(60).text), SCHEMAS["choice"])


def test_preempted_constrained_requests_resume_with_their_state(tiny_dir: Path, alone_engine: Engine) -> None:
    prompts = [f"preempt {i} " * 3 for i in range(6)]
    rfs = [response_format("nested" if i % 2 else "flags") for i in range(6)]
    kws = [{"response_format": rf, "temperature": 1.0, "seed": i} for i, rf in enumerate(rfs)]
    want = [alone_engine.generate(p, 160, **kw) for p, kw in zip(prompts, kws, strict=True)]
    with make_engine(tiny_dir, capacity_blocks=40, page_size=4) as small:  # 6 requests need ~90 pages at their ends
        release = hold_engine_loop(small)
        try:
            handles = [small.submit(p, 160, **kw) for p, kw in zip(prompts, kws, strict=True)]
        finally:
            release()
        got = [h.result(120) for h in handles]
        assert sum(g.preemptions for g in got) > 0
        assert [g.token_ids for g in got] == [w.token_ids for w in want]
        for g, i in zip(got, range(6), strict=True):
            jsonschema.validate(json.loads(g.text), SCHEMAS["nested" if i % 2 else "flags"])
        assert small.check()["locked_blocks"] == 0


def test_a_stream_cancelled_mid_way_leaves_nothing_locked(engine: Engine) -> None:
    async def first_deltas() -> list[str]:
        out = []
        async for delta in engine.stream("stream me", 200, grammar=GrammarSpec.regex("[a-z]{60}")):
            out.append(delta)
            if len(out) == 3:
                break
        return out

    assert len(asyncio.run(first_deltas())) == 3
    deadline = time.monotonic() + 30
    while engine.check()["running"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.check()["locked_blocks"] == 0


def test_streamed_constrained_text_equals_the_result(engine: Engine) -> None:
    rf = response_format("flags")

    async def whole() -> str:
        return "".join([d async for d in engine.stream("stream me too", 120, response_format=rf)])

    assert asyncio.run(whole()) == engine.generate("stream me too", 120, response_format=rf).text


def test_a_malformed_schema_is_a_clear_error_and_the_engine_keeps_serving(engine: Engine) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": {"age": {"type": "integr"}}}}}
    before = engine.stats.requests
    with pytest.raises(GrammarError) as info:
        engine.generate("x", 10, response_format=bad)
    assert isinstance(info.value, ValueError)
    assert info.value.path == "response_format.json_schema.schema.properties.age.type"
    with pytest.raises(GrammarError, match="regex"):
        engine.generate("x", 10, grammar=GrammarSpec.regex("(unclosed"))
    with pytest.raises(ValueError, match="response_format"):
        engine.generate("x", 10, response_format={"type": "yaml"})
    with pytest.raises(ValueError, match="grammar"):
        engine.generate("x", 10, grammar="[0-9]+")
    assert engine.stats.requests == before  # nothing was queued
    r = engine.generate("x", 120, response_format=response_format("flags"))
    jsonschema.validate(json.loads(r.text), SCHEMAS["flags"])


def test_a_grammar_failing_mid_decode_fails_its_request_alone(engine: Engine, alone_engine: Engine) -> None:
    rf = response_format("flags")
    broken_accept = engine._request("one", 120, response_format=rf)
    broken_mask = engine._request("two", 120, response_format=rf)
    good = engine._request("three", 120, response_format=rf)
    bystander = engine._request("four", 30, ignore_eos=True)
    accept, seen = broken_accept.grammar.accept, []  # type: ignore[union-attr]

    def failing_accept(token: int) -> None:
        seen.append(token)
        if len(seen) == 4:
            raise GrammarError("injected", "response_format")
        accept(token)

    def failing_fill(row: Any) -> bool:
        raise RuntimeError("injected mask failure")

    broken_accept.grammar.accept = failing_accept  # type: ignore[union-attr, method-assign]
    broken_mask.grammar.fill_without_matcher = failing_fill  # type: ignore[union-attr, method-assign]
    handles = engine._enqueue([broken_accept, broken_mask, good, bystander])
    with pytest.raises(GrammarError, match="injected"):
        handles[0].result(60)
    with pytest.raises(RuntimeError, match="injected mask failure"):
        handles[1].result(60)
    assert handles[2].result(60).token_ids == alone_engine.generate("three", 120, response_format=rf).token_ids
    assert handles[3].result(60).token_ids == alone_engine.generate("four", 30, ignore_eos=True).token_ids
    assert engine.check()["locked_blocks"] == 0


def test_rows_without_a_grammar_are_passed_on_as_they_are(engine: Engine) -> None:
    reqs = [engine._request("a", 4), engine._request("b", 4)]
    rows = [(r, torch.zeros(engine.config.vocab_size)) for r in reqs]
    assert engine.output.constrain(rows, lambda r, e: None) is rows


def _threads() -> int:
    """This process's threads, native ones included (llguidance's mask pool is Rust's)."""
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_close_releases_the_mask_thread_pool(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine of 8+ cores masks a batch of grammars on a thread pool (0.8 of the cores, up to 32 threads). close()
    kept it: every closed engine a process still referenced (a server's, a test's, a notebook's) held its threads."""
    engine = make_engine(tiny_dir)
    engine.output.masker._parallel = True  # as on a machine with the cores, whose pool has several threads
    monkeypatch.setattr(structured, "make_executor", lambda: make_executor(4))
    before = _threads()
    engine.generate(["a", "b", "c"], 5, response_format=response_format("flags"))
    assert engine.close()
    deadline = time.monotonic() + 10
    while _threads() > before and time.monotonic() < deadline:  # a released pool's threads end on their own
        time.sleep(0.02)
    assert _threads() <= before
