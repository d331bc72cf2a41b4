"""A completions job (a list of prompts, n samples of each) enters the engine's queue whole, as one call of the
Python API does: its own choices never count against `--max-queue`. A job of more choices than the limit is a 400
naming max_queue (the Python API's ValueError: no wait would let it in), a job that fits an idle engine is served,
and a job refused by a full queue (a 429) queued nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

PROMPTS = [[1 + (7 * i + j) % 200 for j in range(20)] for i in range(3)]  # distinct: no shared pages


def _engine(max_queue: int) -> Engine:
    m = tiny_model(seed=7)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    return Engine(model, capacity_blocks=128, max_queue=max_queue)


@pytest.fixture
def served() -> Iterator[tuple[TestClient, Engine]]:
    engine = _engine(max_queue=2)
    with TestClient(create_app(engine, "tiny")) as client:
        yield client, engine
    engine.close()


def _body(prompts: list[list[int]], n: int = 1, stream: bool = False) -> dict:
    return {"model": "tiny", "prompt": prompts, "n": n, "max_tokens": 3, "temperature": 0, "stream": stream}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("prompts", "n"), [(PROMPTS, 1), (PROMPTS[:2], 2)], ids=["3 prompts", "2 prompts x 2"])
def test_a_job_larger_than_max_queue_is_a_400_as_the_python_api_refuses_it(served, prompts, n, stream) -> None:
    client, engine = served
    with pytest.raises(ValueError, match="max_queue is 2") as refused:  # the Python API's answer to the same call
        engine.submit_group([p for p in prompts for _ in range(n)], 3)
    r = client.post("/v1/completions", json=_body(prompts, n, stream))
    assert r.status_code == 400, r.text  # before: 429 (or 200 when the loop happened to admit the first in time)
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] == str(refused.value)
    assert engine.check()["waiting"] == 0 and engine.queue.waiting == 0


def test_a_job_that_fits_an_idle_queue_is_served_whatever_its_own_choices_wait_for(served) -> None:
    client, engine = served
    held, release = threading.Event(), threading.Event()
    stall = threading.Thread(target=engine._loop.wait_for, args=(lambda _: held.set() or release.wait(30),))
    stall.start()  # the loop admits nothing meanwhile: every choice of the job waits at once
    try:
        assert held.wait(10)
        answer: dict = {}
        post = threading.Thread(target=lambda: answer.update(r=client.post("/v1/completions", json=_body(PROMPTS[:2]))))
        post.start()
        deadline = time.monotonic() + 10
        while engine.queue.waiting < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.queue.waiting == 2  # the whole job waits, and is not refused for its own choices
    finally:
        release.set()
        stall.join()
    post.join(30)
    r = answer["r"]
    assert r.status_code == 200, r.text
    reference = [engine.generate(p, 3, temperature=0).text for p in PROMPTS[:2]]
    assert [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])] == reference
