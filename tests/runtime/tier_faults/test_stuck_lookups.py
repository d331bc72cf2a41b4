"""The disk lookups the engine loop makes (`count_prefix` past the index, `forget_missing`: an `lstat` a page) never
hold it on a stuck file system (here a stand-in lookup that blocks until the test lets it go): each waits at most
kv.tier.disk_probe's bound, then goes on with what the index says, and while that look is stuck no other is waited
for; an engine keeps serving. Before, the loop itself made the `lstat`, and a mount that stopped answering stopped
every request, device hits included. A page found absent is looked for again only after ABSENT_S."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.kv.tier import disk_lookups, disk_probe
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.conftest import h, page_path, write


class Stuck:
    """A stand-in for a file system call that blocks (for the calls `blocks(args)` picks) until `opened` is set."""

    def __init__(self, real, blocks=lambda *args: True) -> None:
        self.real, self.blocks = real, blocks
        self.entered, self.opened = threading.Event(), threading.Event()

    def __call__(self, *args):
        if self.blocks(*args):
            self.entered.set()
            self.opened.wait()
        return self.real(*args)


def _within(call, *args):
    """`call(*args)` on a thread, with a hang check (not a timing): its result."""
    out: list = []
    caller = threading.Thread(target=lambda: out.append(call(*args)), daemon=True)
    caller.start()
    caller.join(30)
    assert not caller.is_alive(), f"{call.__name__} waited for a stuck file system"
    return out[0]


def test_a_stuck_lookup_past_the_index_does_not_hold_the_caller(open_store, monkeypatch) -> None:
    reader, writer = open_store(), open_store()
    write(writer, 0, 1)
    stuck = Stuck(disk_lookups.probe_pages)
    monkeypatch.setattr(disk_lookups, "probe_pages", stuck)
    try:
        assert _within(reader.count_prefix, [h(0), h(1)]) == 0  # not answered in time: what the index says
        assert stuck.entered.is_set()
        assert _within(reader.count_prefix, [h(0), h(1)]) == 0  # still stuck: not waited for again
    finally:
        stuck.opened.set()
    monkeypatch.setattr(disk_lookups, "probe_pages", stuck.real)
    for _ in range(100):  # the stuck look ends (its answer dropped); the next one is answered
        if (found := reader.count_prefix([h(0), h(1)])) == 2:
            break
        threading.Event().wait(0.05)
    assert found == 2


def test_a_stuck_check_for_vanished_pages_does_not_hold_the_caller(open_store, monkeypatch) -> None:
    store = open_store()
    write(store, 0, 1)
    path = str(page_path(store, h(0)))
    os.unlink(path)
    stuck = Stuck(os.path.lexists, lambda p: p == path)
    monkeypatch.setattr(disk_lookups.os.path, "lexists", stuck)
    try:
        assert _within(store.forget_missing, [h(0), h(1)]) == 0 and stuck.entered.is_set()
    finally:
        stuck.opened.set()
    monkeypatch.setattr(disk_lookups.os.path, "lexists", stuck.real)
    for _ in range(100):
        if (gone := store.forget_missing([h(0), h(1)])) == 1:
            break
        threading.Event().wait(0.05)
    assert gone == 1 and h(0) not in store and h(1) in store


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=5)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def test_an_engine_keeps_serving_while_its_disk_lookups_are_stuck(model, tmp_path: Path, monkeypatch) -> None:
    prompts = [[(7 * i + j) % 90 + 1 for j in range(30)] for i in range(2)]
    opts = {"capacity_blocks": 100, "page_size": 4, "dtype": "float64"}
    with Engine(model, enable_cache=False, **opts) as plain:
        want = [plain.generate(p, 3, ignore_eos=True).token_ids for p in prompts]
    stuck = Stuck(disk_lookups.probe_pages)
    monkeypatch.setattr(disk_lookups, "probe_pages", stuck)
    engine = Engine(model, cache_dir=tmp_path / "kv", load_back="always", **opts)
    try:
        got = [_within(engine.generate, p, 3).token_ids for p in prompts]  # (ignore_eos: the default 3 tokens)
        assert stuck.entered.is_set() and engine.tiers.disk._probe.given_up == 1
    finally:
        stuck.opened.set()
        engine.close()
    assert got == want


def test_a_page_found_absent_is_looked_for_again_later(open_store, monkeypatch) -> None:
    reader, writer = open_store(), open_store()
    now = [0.0]
    monkeypatch.setattr(disk_probe, "_clock", lambda: now[0])
    assert reader.count_prefix([h(0)]) == 0
    write(writer, 0)
    assert reader.count_prefix([h(0)]) == 0  # remembered absent
    now[0] = disk_probe.ABSENT_S
    assert reader.count_prefix([h(0)]) == 1


def test_a_second_caller_waits_its_turn_while_a_look_is_within_its_bound() -> None:
    probe = disk_probe.FileProbe(wait_s=30.0)
    entered, opened = threading.Event(), threading.Event()
    first: list = []

    def slow() -> str:
        entered.set()
        opened.wait()
        return "first"

    asker = threading.Thread(target=lambda: first.append(probe.look(slow)), daemon=True)
    asker.start()
    assert entered.wait(30)
    second: list = []
    waiter = threading.Thread(target=lambda: second.append(probe.look(lambda: "second")), daemon=True)
    waiter.start()
    threading.Event().wait(0.05)  # (the second caller is waiting for its turn by now, most likely)
    opened.set()
    for thread in (asker, waiter):
        thread.join(30)
    assert first == [(True, "first")] and second == [(True, "second")]  # not given up: the first was not stuck
