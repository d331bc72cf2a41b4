"""Pins counted per holder (tiny checkpoint, 256 pages of 16 tokens): every Session holds its own share of a pin,
so two sessions (a `copy()`, one loaded from a save) pinning the same history each release only their own. Before,
the engine kept one pin per prompt: `s1.unpin()` returned 1 and released s2's pin too (pinned_blocks 0), and
`s2.unpin()` then returned 0. A plain caller pinning the same prompt again still holds one pin, which one unpin
releases (no pages leak for a client that pins its system prompt at every request)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixcache.runtime import Engine
from radixcache.runtime.engine.session import Session
from tests.runtime.structured.conftest import PAGE, make_engine

KW = {"pin": True, "max_new_tokens": 2, "ignore_eos": True}


def _pages(pins: list[tuple[tuple[int, ...], int]]) -> int:
    """Pages a set of pins locks, counted naively: every distinct page-aligned prefix a pin covers, once."""
    return len({ids[: k * PAGE] for ids, n in pins for k in range(1, n // PAGE + 1)})


def test_two_sessions_pinning_the_same_history_each_release_only_their_own(engine: Engine) -> None:
    s1 = engine.session(system="sys prompt " * 4, **KW)
    s2 = engine.session(system="sys prompt " * 4, **KW)
    r1, r2 = s1.send("hello there"), s2.send("hello there")
    assert r1.pinned_for == r2.pinned_for and r1.pinned_tokens == r2.pinned_tokens > 0  # the very same prompt
    pages = r1.pinned_tokens // PAGE
    assert engine.stats.pinned_blocks == pages and len(engine.kv.pins) == 1  # one lock, pages counted once
    assert s1.unpin() == 1
    assert engine.stats.pinned_blocks == pages  # s2's share holds
    assert s2.unpin() == 1 and engine.stats.pinned_blocks == 0 and len(engine.kv.pins) == 0
    assert engine.check()["locked_blocks"] == 0


def test_a_copy_and_a_loaded_session_hold_their_own_shares(engine: Engine, tmp_path: Path) -> None:
    s = engine.session(system="copied " * 6, **KW)
    s.send("one")
    twin = s.copy()
    s.save(tmp_path / "s.json")
    loaded = Session.load(engine, tmp_path / "s.json")
    rs, rt, rl = s.send("two"), twin.send("two"), loaded.send("two")
    assert rs.pinned_for == rt.pinned_for == rl.pinned_for
    pages = rs.pinned_tokens // PAGE
    assert s.unpin() == 1 and engine.stats.pinned_blocks == pages
    assert twin.unpin() == 1 and engine.stats.pinned_blocks == pages
    assert loaded.unpin() == 1 and engine.stats.pinned_blocks == 0


def test_a_plain_caller_pinning_the_same_prompt_again_unpins_it_once(engine: Engine) -> None:
    prompt = "the system prompt every request repeats " * 3
    for _ in range(3):
        assert engine.generate(prompt, 1, pin=True).pinned_tokens > 0
    held = engine.stats.pinned_blocks
    assert engine.unpin(prompt) == 1 and engine.stats.pinned_blocks == 0 < held
    # a named holder releases its own share, and engine.unpin(prompt) with no holder every holder's
    for holder in ("a", "b"):
        engine.generate(prompt, 1, pin=True, pin_holder=holder)
    assert engine.unpin(prompt, pin_holder="a") == 1 and engine.stats.pinned_blocks == held
    assert engine.unpin(prompt, pin_holder="a") == 0
    engine.generate(prompt, 1, pin=True, pin_holder="a")
    assert engine.unpin(prompt) == 1 and engine.stats.pinned_blocks == 0 and len(engine.kv.pins) == 0


class Holders(RuleBasedStateMachine):
    """Random turns, forks, copies, unpins and closes across three sessions of one system prompt and a two-word
    vocabulary (so their prompts often coincide), against a reference: each live or dropped session -> the ids and
    tokens of the pin it holds. After each step the engine's pinned pages and locked pages are the reference's."""

    engine: Engine

    def __init__(self) -> None:
        super().__init__()
        self.sessions = [self.engine.session(system="shared system prompt " * 3, **KW) for _ in range(3)]
        self.held: dict[int, tuple[tuple[int, ...], int]] = {}  # id(session) -> (pinned_for, pinned_tokens)
        self.dropped: list[Session] = []  # kept alive: their ids stay theirs

    def _took(self, s: Session, pinned_for: tuple[int, ...], pinned_tokens: int) -> None:
        if pinned_tokens:
            self.held[id(s)] = (pinned_for, pinned_tokens)

    @rule(i=st.integers(0, 2), word=st.sampled_from(["yes", "no"]))
    def send(self, i: int, word: str) -> None:
        s = self.sessions[i]
        r = s.send(word)
        self._took(s, r.pinned_for, r.pinned_tokens)

    @rule(i=st.integers(0, 2))
    def fork(self, i: int) -> None:
        s = self.sessions[i]
        best = max(s.fork(2, temperature=1.0, seed=3), key=lambda r: r.pinned_tokens)
        self._took(s, best.pinned_for, best.pinned_tokens)

    @rule(i=st.integers(0, 2), j=st.integers(0, 2))
    def copy(self, i: int, j: int) -> None:
        """Session i is dropped without unpin (its share stays held) and replaced by a copy of session j."""
        self.dropped.append(self.sessions[i])
        self.sessions[i] = self.sessions[j].copy()

    @rule(i=st.integers(0, 2))
    def unpin(self, i: int) -> None:
        s = self.sessions[i]
        assert s.unpin() == (1 if self.held.pop(id(s), None) else 0)

    @rule(i=st.integers(0, 2))
    def close(self, i: int) -> None:
        s = self.sessions[i]
        with s:
            pass
        self.held.pop(id(s), None)
        assert s.unpin() == 0

    @precondition(lambda self: bool(self.held))
    @rule()
    def unpin_everything(self) -> None:
        """engine.unpin() releases every holder's pins, dropped sessions' too."""
        assert self.engine.unpin() == len(set(self.held.values()))  # one per prompt and pinned prefix
        self.held.clear()

    @invariant()
    def locks_match_the_reference(self) -> None:
        expected = _pages(list(self.held.values()))
        assert self.engine.stats.pinned_blocks == expected
        assert self.engine.check()["locked_blocks"] == expected
        assert len(self.engine.kv.pins) == len({(ids[:n]) for ids, n in self.held.values()})

    def teardown(self) -> None:
        self.engine.unpin()


def test_pins_follow_a_reference_of_holders(tiny_dir: Path) -> None:
    with make_engine(tiny_dir) as engine:
        Holders.engine = engine
        Holders.TestCase.settings = settings(
            max_examples=10,
            stateful_step_count=12,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        Holders.TestCase().runTest()
        assert engine.check()["locked_blocks"] == 0
