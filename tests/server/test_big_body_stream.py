"""A client posting a body of tens of MiB (a 34 MiB token-id prompt) while another client streams: the big body is
parsed and validated off the event loop (runtime.server.body_parse), so the stream's deltas keep arriving while it
is. Before, `json.loads` and pydantic ran on the loop for seconds, and the stream received nothing meanwhile. A real
uvicorn server on 127.0.0.1 over the tiny random model, the `openai` client streaming, the big body from a socket."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

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


def _post(port: int, path: str, raw: bytes, before_last_byte: Callable[[], None]) -> bytes:
    """The response's status line, once it comes, to `raw` posted as JSON: all of it but its last byte, then
    `before_last_byte()`, then that byte."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
        head += "\r\n"
        s.sendall(head.encode() + raw[:-1])
        before_last_byte()
        s.sendall(raw[-1:])
        s.settimeout(300)
        return s.recv(64).split(b"\r\n", 1)[0]


@pytest.mark.slow  # a 34 MiB body parsed (seconds) while a stream runs
def test_a_stream_keeps_flowing_while_a_huge_body_is_parsed(engine: Engine) -> None:
    app = create_app(engine, "tiny")
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

        def wait_for(count: int) -> int:
            while len(deltas) < count and reader.is_alive():
                time.sleep(0.01)
            return len(deltas)

        wait_for(5)
        sent = 0

        def read_by_now() -> None:  # the loop has had time to read the body's other bytes: only the parse is left
            nonlocal sent
            sent = wait_for(len(deltas) + 20)

        status = _post(port, "/v1/completions", raw, read_by_now)  # parsed, validated, refused for its model
        answered = len(deltas)
        stop.set()
        reader.join(60)
    assert status == b"HTTP/1.1 404 Not Found"
    assert answered < MAX_TOKENS, "the stream ended before the body was answered: the count says nothing"
    # deltas arriving while the body was parsed and validated: 1 before the fix and 113 after on the VM it was made
    # on (AVX-512, under load); on an idle AVX2 EPYC Zen 3 2-3 without the off-loop parse and 3-4 with it, 19 in a CI
    # run: the count rides on the machine, so this bar only says the stream was not stopped (see the stop's note)
    assert answered - sent >= 2, (sent, answered)
