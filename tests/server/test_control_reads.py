"""/metrics and /health/cache never hold the threads requests need. Behind replicas each is a Ray call to every
replica, which a frozen one (SIGSTOPped: alive, answering nothing) holds for its whole bound; they ran in the event
loop's default executor (6 threads on 2 cores), so six scrapes at once left a completion's tokenising (to_thread)
waiting behind them, for a healthy replica too. In-process app over the tiny random model, with an engine whose
stats and check block until released, as a frozen replica's do."""

from __future__ import annotations

import threading
from typing import Any

from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

SCRAPES = 40  # past the default executor's most threads, min(32, cores + 4), on any machine
PROBES = 4
HANG_S = 30.0  # a bound on a hang, never reached with the fix


class FrozenReadsEngine(Engine):
    """An Engine whose stats and check wait for `thaw`, as a gather over a frozen replica waits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.thaw, self.entered = threading.Event(), threading.Event()

    @property
    def stats(self):  # type: ignore[override]
        self.entered.set()
        self.thaw.wait(4 * HANG_S)
        return super().stats

    def check(self, timeout: float | None = 30.0) -> dict[str, int]:
        self.entered.set()
        self.thaw.wait(4 * HANG_S)
        return super().check(timeout)


def test_a_completion_is_answered_while_scrapes_and_probes_wait_on_frozen_replicas() -> None:
    m = tiny_model(seed=4)
    engine = FrozenReadsEngine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=64)
    try:
        with TestClient(create_app(engine, "tiny", public_metrics=True)) as client:
            codes: list[int] = []
            readers = [
                threading.Thread(target=lambda p=path: codes.append(client.get(p).status_code))
                for path in ["/metrics"] * SCRAPES + ["/health/cache"] * PROBES
            ]
            for t in readers:
                t.start()
            assert engine.entered.wait(HANG_S)
            done: list[Any] = []
            body = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0}
            sender = threading.Thread(target=lambda: done.append(client.post("/v1/completions", json=body)))
            sender.start()
            sender.join(HANG_S)
            answered = not sender.is_alive()  # the reads are still frozen: nothing has thawed them yet
            engine.thaw.set()
            for t in [sender, *readers]:
                t.join(HANG_S)
            assert answered, "the completion waited behind the scrapes"
            assert done[0].status_code == 200 and len(done[0].json()["choices"][0]["text"]) > 0
            assert codes == [200] * (SCRAPES + PROBES)
    finally:
        engine.thaw.set()
        engine.close()


def test_the_control_threads_end_with_the_app() -> None:
    """An app's shutdown lets its control threads go (an app made per test, or per server restart in one process,
    kept two idle threads for good); a later start makes them again."""
    m = tiny_model(seed=4)
    with Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=64) as engine:
        app = create_app(engine, "tiny", public_metrics=True)
        for _ in range(2):
            with TestClient(app) as client:
                assert client.get("/metrics").status_code == 200
                assert client.get("/health/cache").json()["invariants"] == "ok"
                mine = [t for t in threading.enumerate() if t.name.startswith("radixcache-control")]
                assert mine
            for t in mine:
                t.join(HANG_S)
            assert not any(t.is_alive() for t in mine)
