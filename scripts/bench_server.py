"""Replay a multi-turn chat trace against `radixcache serve` with N concurrent clients (the openai package),
with the prefix cache on and off: request throughput, streaming TTFT p50/p99, and the hit rate from /metrics.

Each conversation is one client that sends its turns in order, streaming, with the replies it got appended to
its history (so each turn's prompt extends the last). Clients run `--concurrency` at a time. The script starts the
server itself (a subprocess on 127.0.0.1, once with the cache and once with --no-cache), or measures `--url`.

    .venv/bin/python scripts/bench_server.py --concurrency 4 --max-tokens 16
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from radixcache.trace.text import Conversation, iter_conversations  # noqa: E402

SAMPLE = REPO / "radixcache" / "data" / "sample_chat.jsonl"


@dataclass(frozen=True, slots=True)
class Row:
    mode: str
    requests: int
    seconds: float
    ttft_p50: float
    ttft_p99: float
    hit_rate: float
    cached_tokens: int
    prompt_tokens: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def percentile(values: list[float], q: float) -> float:
    xs = sorted(values)
    if not xs:
        return 0.0
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{", 1)[0] if 'le="' not in name else name] = float(value)
    return out


@contextlib.contextmanager
def serving(model: str, extra: list[str], timeout: float = 300) -> Iterator[str]:
    """A `radixcache serve` subprocess on a free loopback port, served as "bench": yields its base URL."""
    with server_process(model, extra, timeout) as (url, _):
        yield url


@contextlib.contextmanager
def server_process(
    model: str, extra: list[str], timeout: float = 300, name: str = "bench"
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`serving`, also yielding the process (to read its memory); stopped with SIGTERM, then killed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-c", "from radixcache.cli.main import run; run()", "serve", "--model", model]
    cmd += ["--port", str(port), "--served-model-name", name, *extra]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"error: the server exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("error: the server did not start")
            time.sleep(0.25)
        yield url, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _client_run(client: openai.OpenAI, model: str, conv: Conversation, max_tokens: int) -> list[tuple[float, int, int]]:
    """One conversation, turn by turn: (ttft_s, cached_tokens, prompt_tokens) per turn."""
    history = [{"role": "system", "content": conv.system}] if conv.system else []
    out = []
    for turn in conv.turns:
        history.append({"role": "user", "content": turn.user})
        t0 = time.perf_counter()
        ttft, parts, usage = None, [], None
        stream = client.chat.completions.create(
            model=model,
            messages=history,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
        history.append({"role": "assistant", "content": "".join(parts)})
        cached = usage.prompt_tokens_details.cached_tokens if usage and usage.prompt_tokens_details else 0
        out.append(
            (ttft if ttft is not None else time.perf_counter() - t0, cached, usage.prompt_tokens if usage else 0)
        )
    return out


def bench(url: str, mode: str, convs: list[Conversation], concurrency: int, max_tokens: int, model: str) -> Row:
    before = metrics(url)
    client = openai.OpenAI(base_url=url + "/v1", api_key="bench", max_retries=0, timeout=600)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        runs = list(pool.map(lambda c: _client_run(client, model, c, max_tokens), convs))
    seconds = time.perf_counter() - t0
    after = metrics(url)
    turns = [t for run in runs for t in run]
    queries = (
        after["radixcache_prefix_cache_queries_tokens_total"] - before["radixcache_prefix_cache_queries_tokens_total"]
    )
    hits = after["radixcache_prefix_cache_hits_tokens_total"] - before["radixcache_prefix_cache_hits_tokens_total"]
    ttfts = [t[0] for t in turns]
    return Row(
        mode,
        len(turns),
        seconds,
        percentile(ttfts, 0.5),
        percentile(ttfts, 0.99),
        hits / queries if queries else 0.0,
        sum(t[1] for t in turns),
        sum(t[2] for t in turns),
    )


def synthetic(n: int, turns: int) -> list[Conversation]:
    from radixcache.trace.text import Turn

    system = "You are a careful assistant for a bookshop. Be brief, polite and exact about prices and stock. " * 4
    return [
        Conversation(
            f"s{i}",
            tuple(Turn(f"Question {j} from reader {i}: is book {i * 7 + j} in stock?") for j in range(turns)),
            system,
        )
        for i in range(n)
    ]


def table(rows: list[Row]) -> str:
    lines = [
        "| cache | requests | req/s | TTFT p50 (ms) | TTFT p99 (ms) | hit rate (/metrics) | cached / prompt tokens |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.mode} | {r.requests} | {r.rps:.2f} | {r.ttft_p50 * 1000:.0f} | {r.ttft_p99 * 1000:.0f} | "
            f"{r.hit_rate:.1%} | {r.cached_tokens} / {r.prompt_tokens} |"
        )
    if len(rows) == 2 and rows[1].rps and rows[0].ttft_p50:
        on, off = rows
        lines.append(
            f"\nthroughput on/off: {on.rps / off.rps:.2f}x · TTFT p50 off/on: {off.ttft_p50 / on.ttft_p50:.2f}x"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trace", default=str(SAMPLE), help="conversation JSONL [default: the sample], or 'synthetic'")
    ap.add_argument("--model", default="smollm2", help="what the server loads (ignored with --url)")
    ap.add_argument("--url", help="measure a running server (as-is, one mode) instead of starting one")
    ap.add_argument("--served-model-name", default="bench", help="the model id a --url server serves")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--limit", type=int, help="only the first N conversations")
    ap.add_argument("--kv-memory", default="256MiB")
    args = ap.parse_args()
    convs = synthetic(8, 4) if args.trace == "synthetic" else list(iter_conversations(args.trace))
    convs = convs[: args.limit] if args.limit else convs
    if args.url:
        rows = [
            bench(args.url.rstrip("/"), "as served", convs, args.concurrency, args.max_tokens, args.served_model_name)
        ]
    else:
        rows = []
        for mode, extra in (("on", []), ("off", ["--no-cache"])):
            with serving(args.model, ["--kv-memory", args.kv_memory, *extra]) as url:
                rows.append(bench(url, mode, convs, args.concurrency, args.max_tokens, "bench"))
    print(
        f"{len(convs)} conversations, {args.concurrency} concurrent clients, {args.max_tokens} tokens per reply, "
        f"model {args.model if not args.url else args.url}"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
