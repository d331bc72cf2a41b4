"""What a streaming client sees while another client's huge body is parsed: the body parsed off the event loop in
pieces (runtime.server.body_parse, the server's way) against the baseline of FastAPI parsing it on the loop (the
same server with BIG_BODY_BYTES raised past the body), interleaved in one process, on the tiny random model.

    .venv/bin/python scripts/bench_big_body.py                 # a token-id body of about 34 MiB, 2 rounds each
    .venv/bin/python scripts/bench_big_body.py --mib 8 --rounds 3

A client streams; another posts the body (for a model the server does not serve: a 404 once parsed and validated),
all but its last byte first. From that byte to the answer: the deltas the stream received and the longest gap
between them. Timings on a shared machine are noisy: compare the two modes within one run only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import openai
import uvicorn

import radixcache.runtime.server.body_parse as body_parse
from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

MAX_TOKENS = 20_000


@contextmanager
def serving(app: Any) -> Iterator[int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)


def one_round(port: int, client: openai.OpenAI, eos: int, raw: bytes) -> tuple[float, int, float]:
    """(seconds from the body's last byte to its answer, deltas streamed meanwhile, the longest gap between them)."""
    stamps: list[float] = []
    stop = threading.Event()

    def read() -> None:
        stream = client.completions.create(
            model="tiny", prompt="go", max_tokens=MAX_TOKENS, stream=True, logit_bias={str(eos): -100}
        )
        for _ in stream:
            stamps.append(time.monotonic())
            if stop.is_set():
                break
        stream.close()

    reader = threading.Thread(target=read)
    reader.start()
    while len(stamps) < 20:
        time.sleep(0.01)
    with socket.create_connection(("127.0.0.1", port)) as s:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        s.sendall(head + b"Content-Length: %d\r\n\r\n" % len(raw) + raw[:-1])
        time.sleep(1.0)  # the server reads the rest; only the parse is left
        start = time.monotonic()
        s.sendall(raw[-1:])
        s.settimeout(300)
        s.recv(64)
        end = time.monotonic()
    stop.set()
    reader.join()
    edges = [start, *(t for t in stamps if start <= t <= end), end]
    return end - start, len(edges) - 2, max(b - a for a, b in itertools.pairwise(edges))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=34.0, help="about the body's size (token ids of up to 5 digits)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    count = int(args.mib * (1 << 20) / 7)
    ids = [i * 7919 % 50_000 for i in range(count // 6)]
    raw = json.dumps({"model": "another-model", "prompt": [ids] * 6, "max_tokens": 1}).encode()
    m = tiny_model(seed=3, max_position=MAX_TOKENS + 64)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    big = body_parse.BIG_BODY_BYTES
    with Engine(model, capacity_blocks=(MAX_TOKENS + 64) // 16 + 8) as engine:
        app = create_app(engine, "tiny")
        with serving(app) as port, openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x") as client:
            longest: dict[str, list[float]] = {"on the loop": [], "off the loop": []}
            print(f"a body of {len(raw) / (1 << 20):.1f} MiB while a stream runs")
            for _ in range(args.rounds):
                for mode in longest:
                    body_parse.BIG_BODY_BYTES = big if mode == "off the loop" else 1 << 62
                    took, deltas, gap = one_round(port, client, engine.eos_token_ids[0], raw)
                    longest[mode].append(gap)
                    print(
                        f"{mode:13s} answered in {took:5.2f} s, {deltas:4d} deltas meanwhile, longest gap {gap:.2f} s"
                    )
            body_parse.BIG_BODY_BYTES = big
            on, off = (max(v) for v in longest.values())
            print(f"longest gap: {off:.2f} s off the loop against {on:.2f} s on it ({on / off:.1f}x shorter)")


if __name__ == "__main__":
    main()
