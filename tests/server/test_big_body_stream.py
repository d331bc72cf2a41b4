"""A client posting a body of tens of MiB (a 34 MiB token-id prompt) while another client streams: the big body is
parsed and validated off the event loop, in pieces between which the loop runs (runtime.server.body_parse). Before,
`json.loads` and pydantic ran on the loop for seconds, and no other client was served meanwhile; in a thread alone
they would too, as each holds the GIL for its whole call.

What is checked is the loop itself, not a count of deltas: how many deltas the stream gets meanwhile rides on the
machine and its load (the bar of 20 held only sometimes on an AVX2 VM, which once saw 2 to 4 deltas whether or not
the parse was in pieces, and later 170 to 260 in pieces against 1 or 2 on the loop). A task on the server's loop
stamps each of its turns; from the body's last byte to its answer, the longest the loop went without a turn must be
a small part of that time: parsed on the loop, or whole in a thread, it is about half of it (json.loads and pydantic
each hold the GIL for their whole call); in pieces, what is left on the loop (joining the body's bytes, freeing the
parsed body: tenths of a second of several seconds). A real uvicorn server on 127.0.0.1 over the tiny random model,
the `openai` client streaming, the big body from a socket."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.server.uvicorn_thread import serving

MAX_TOKENS = 4000


@pytest.fixture
def engine() -> Iterator[Engine]:
    m = tiny_model(seed=3, max_position=MAX_TOKENS + 64)
    tok = CharTokenizer(m.config.vocab_size)
    with Engine(RandomModel(m.config, m.weights, tok), capacity_blocks=(MAX_TOKENS + 64) // 16 + 8) as e:
        yield e


class LoopTurns:
    """The times of the server's event-loop turns: a task on its loop (started by POST /loop-turns) that stamps the
    clock and sleeps a millisecond, until `stop`."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.stopped = False
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> dict[str, str]:
        self.task = asyncio.get_running_loop().create_task(self._turns())
        return {}

    async def _turns(self) -> None:
        while not self.stopped:
            self.stamps.append(time.monotonic())
            await asyncio.sleep(0.001)

    def longest_stall(self, start: float, end: float) -> float:
        """The longest time between `start` and `end` in which the loop took no turn."""
        edges = [start, *(t for t in self.stamps if start <= t <= end), end]
        return max(b - a for a, b in itertools.pairwise(edges))


def _post(port: int, path: str, raw: bytes, before_last_byte: Callable[[], None]) -> tuple[bytes, float, float]:
    """(the response's status line, when the body's last byte was sent, when the status came) for `raw` posted as
    JSON: all of it but its last byte, then `before_last_byte()`, then that byte."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
        head += "\r\n"
        s.sendall(head.encode() + raw[:-1])
        before_last_byte()
        start = time.monotonic()
        s.sendall(raw[-1:])
        s.settimeout(300)
        status = s.recv(64).split(b"\r\n", 1)[0]
        return status, start, time.monotonic()


@pytest.mark.slow  # a 34 MiB body parsed (seconds) while a stream runs
def test_the_event_loop_turns_while_a_huge_body_is_parsed(engine: Engine) -> None:
    app = create_app(engine, "tiny")
    turns = LoopTurns()
    app.add_api_route("/loop-turns", turns.start, methods=["POST"])
    ids = [i * 7919 % 50_000 for i in range(900_000)]  # 5-digit ids: 34 MiB in all
    raw = json.dumps({"model": "another-model", "prompt": [ids] * 6, "max_tokens": 1}).encode()
    assert len(raw) > 30 << 20
    deltas, stop = [], threading.Event()
    with serving(app) as port, openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x") as client:

        def read() -> None:
            stream = client.completions.create(
                model="tiny",
                prompt="stream on",
                max_tokens=MAX_TOKENS,
                stream=True,
                temperature=0,
                logit_bias={str(engine.eos_token_ids[0]): -100},
            )
            for chunk in stream:
                deltas.append(chunk.choices[0].text)
                if stop.is_set():
                    break
            stream.close()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()

        def wait_for(count: int) -> None:
            while len(deltas) < count and reader.is_alive():
                time.sleep(0.01)

        wait_for(5)
        assert httpx.post(f"http://127.0.0.1:{port}/loop-turns").status_code == 200

        def read_by_now() -> None:  # the loop has had time to read the body's other bytes: only the parse is left
            wait_for(len(deltas) + 20)

        status, start, end = _post(port, "/v1/completions", raw, read_by_now)  # parsed, validated, then a 404
        answered = len(deltas)
        turns.stopped = True
        stop.set()
        reader.join(60)
    assert status == b"HTTP/1.1 404 Not Found"
    assert answered < MAX_TOKENS, "the stream ended before the body was answered: the loop served less than asked"
    stall = turns.longest_stall(start, end)
    # an AVX2 EPYC Zen 3 VM: 2.46 s of 4.76 on the loop, 1.60 s of 4.06 whole in a thread, 0.21-0.34 s of 4-8 in pieces
    assert stall < (end - start) / 4, f"the loop stalled {stall:.3f} s of the {end - start:.3f} s the body took"
