"""Soak `radixcache serve`: many clients for minutes of mixed traffic, and proof that nothing leaks or breaks.

Each client loops over a random mix until the time is up: multi-turn chats on a shared system prompt (whole and
streamed), completions (a list of prompts, n=2, logprobs), streams it abandons after a few chunks (a cancel
mid-stream), and bad requests (malformed JSON, an unknown field, a wrong model, a prompt over the context, a
negative max_tokens). The server runs with a queue limit, so overload answers 429 / 503.

It fails (exit 1) on any 500, on any answer that is neither a success nor a documented error, on a stream that
does not end with `data: [DONE]`, when a block stays locked or held afterwards, or when the cache's invariants
do not hold (GET /health/cache). It reports the server's resident memory after warm-up and at the end.

    .venv/bin/python scripts/soak_server.py --clients 64 --duration 180
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from bench_server import server_process  # noqa: E402

SYSTEM = "You are the help desk of a small public library. Answer briefly and kindly, and never invent titles. " * 3
EXPECTED_ERRORS = {400, 404, 429, 503}


@dataclass
class Tally:
    """What the clients saw."""

    outcomes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    last_status: int = 0  # of the latest answer (one client at a time reads it: asyncio, no threads)

    def fail(self, what: str) -> None:
        self.outcomes["FAILURE"] += 1
        if len(self.failures) < 20:
            self.failures.append(what)


def rss_mib(pid: int) -> float:
    """Resident memory of a process (Linux /proc), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


# ---------------------------------------------------------------------------------------------- the actions


async def check_json(tally: Tally, kind: str, r: httpx.Response) -> dict | None:
    tally.last_status = r.status_code
    if r.status_code == 200:
        tally.outcomes[f"{kind} 200"] += 1
        return r.json()
    if r.status_code in EXPECTED_ERRORS:
        err = r.json().get("error", {})
        if not err.get("message"):
            tally.fail(f"{kind}: {r.status_code} without an error message: {r.text[:200]}")
        elif r.status_code in (429, 503) and "retry-after" not in r.headers:
            tally.fail(f"{kind}: {r.status_code} without Retry-After")
        else:
            tally.outcomes[f"{kind} {r.status_code}"] += 1
        return None
    tally.fail(f"{kind}: HTTP {r.status_code}: {r.text[:300]}")
    return None


async def chat(c: httpx.AsyncClient, tally: Tally, rng: random.Random, history: list[dict]) -> None:
    history.append({"role": "user", "content": f"Do you have book number {rng.randint(1, 10**6)}?"})
    body = {"model": "soak", "messages": [{"role": "system", "content": SYSTEM}, *history[-6:]], "max_tokens": 12}
    body["temperature"] = rng.choice([0, 0.7])
    out = await check_json(tally, "chat", await c.post("/v1/chat/completions", json=body))
    history.append({"role": "assistant", "content": out["choices"][0]["message"]["content"] if out else "sorry"})


async def completion(c: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    body: dict = {"model": "soak", "prompt": f"{SYSTEM} Note {rng.randint(1, 10**6)}:", "max_tokens": 8}
    variant = rng.randrange(3)
    if variant == 0:
        body["prompt"] = [body["prompt"], "A second prompt in the same request."]
    elif variant == 1:
        body.update(n=2, temperature=1.0, seed=rng.randint(0, 1000))
    else:
        body.update(logprobs=2, frequency_penalty=0.5)
    await check_json(tally, "completion", await c.post("/v1/completions", json=body))


async def stream(c: httpx.AsyncClient, tally: Tally, rng: random.Random, abandon: bool) -> None:
    kind = "stream-cancel" if abandon else "stream"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Hello {rng.random()}"}]
    body = {"model": "soak", "messages": messages, "max_tokens": 24, "stream": True}
    body["stream_options"] = {"include_usage": True}
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            await check_json(tally, kind, r)
            return
        events = 0
        last = ""
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            events += 1
            last = line[len("data: ") :]
            if last != "[DONE]" and "error" in json.loads(last):
                tally.fail(f"{kind}: an error event: {last[:300]}")
                return
            if abandon and events >= 3:  # the client goes away mid-stream
                tally.outcomes[f"{kind} closed"] += 1
                return
        if last != "[DONE]":
            tally.fail(f"{kind}: the stream ended without [DONE] (last event {last[:200]!r})")
        else:
            tally.outcomes[f"{kind} 200"] += 1


BAD = [
    ("/v1/chat/completions", b'{"model": "soak", "messages": ['),
    ("/v1/chat/completions", {"model": "soak", "messages": [{"role": "user", "content": "x"}], "frobnicate": 1}),
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/completions", {"model": "soak", "prompt": "word " * 9000}),
    ("/v1/completions", {"model": "soak", "prompt": "x", "max_tokens": -1}),
]


async def bad(c: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    path, body = rng.choice(BAD)
    if isinstance(body, bytes):
        r = await c.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = await c.post(path, json=body)
    if r.status_code not in (400, 404):
        tally.fail(f"bad request answered {r.status_code}: {r.text[:200]}")
    else:
        tally.outcomes[f"bad {r.status_code}"] += 1


async def client(url: str, seed: int, until: float, tally: Tally) -> None:
    rng = random.Random(seed)
    history: list[dict] = []
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        while time.monotonic() < until:
            roll = rng.random()
            try:
                if roll < 0.3:
                    await chat(c, tally, rng, history)
                elif roll < 0.5:
                    await completion(c, tally, rng)
                elif roll < 0.7:
                    await stream(c, tally, rng, abandon=False)
                elif roll < 0.85:
                    await stream(c, tally, rng, abandon=True)
                else:
                    await bad(c, tally, rng)
            except httpx.HTTPError as exc:
                tally.fail(f"transport error: {type(exc).__name__}: {exc}")
            if tally.last_status in (429, 503):  # back off a little, as the SDKs do (not the whole Retry-After)
                tally.last_status = 0
                await asyncio.sleep(rng.uniform(0.1, 0.5))
            if len(history) > 12:
                history.clear()


async def soak(url: str, clients: int, duration: float, seed: int) -> Tally:
    tally = Tally()
    until = time.monotonic() + duration
    await asyncio.gather(*(client(url, seed * 1000 + i, until, tally) for i in range(clients)))
    return tally


def sample_rss(pid: int, out: list[float], duration: float, every: float = 2.0) -> None:
    """Read the server's RSS every `every` seconds for `duration` seconds (a thread beside the clients)."""
    until = time.monotonic() + duration
    while time.monotonic() < until:
        out.append(rss_mib(pid))
        time.sleep(every)


def settle(url: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(url + "/health/cache", timeout=60).json()
        if health["running"] == 0 and health["waiting"] == 0 and health["queued"] == 0:
            return health
        if time.monotonic() > deadline:
            return health
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=180.0, help="seconds of traffic after warm-up")
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds of traffic before the first RSS reading")
    ap.add_argument("--max-queue", type=int, default=16)
    ap.add_argument("--queue-timeout", type=float, default=20.0)
    ap.add_argument("--kv-memory", default="256MiB")
    ap.add_argument("--mirror-memory", help="passed to the server (the decode mirror's bound; 0 turns it off)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    extra = ["--max-queue", str(args.max_queue), "--queue-timeout", str(args.queue_timeout)]
    extra += ["--kv-memory", args.kv_memory]
    if args.mirror_memory is not None:
        extra += ["--mirror-memory", args.mirror_memory]
    with server_process(args.model, extra, name="soak") as (url, proc):
        started = rss_mib(proc.pid)
        warm = asyncio.run(soak(url, args.clients, args.warmup, args.seed + 1))
        after_warmup = rss_mib(proc.pid)
        samples: list[float] = []
        sampler = threading.Thread(target=sample_rss, args=(proc.pid, samples, args.duration), daemon=True)
        sampler.start()
        t0 = time.monotonic()
        tally = asyncio.run(soak(url, args.clients, args.duration, args.seed))
        seconds = time.monotonic() - t0
        sampler.join()
        health = settle(url)
        at_end = rss_mib(proc.pid)
    tally.outcomes.update(warm.outcomes)
    tally.failures += warm.failures
    print(f"{args.clients} clients, {args.warmup:.0f} s warm-up + {seconds:.0f} s, model {args.model}")
    print("| outcome | count |\n|---|---:|")
    for outcome, count in sorted(tally.outcomes.items()):
        print(f"| {outcome} | {count} |")
    print(
        f"\nserver RSS: {started:.0f} MiB at start, {after_warmup:.0f} MiB after warm-up, {at_end:.0f} MiB at the "
        f"end ({at_end - after_warmup:+.0f} MiB, {(at_end / after_warmup - 1) * 100:+.1f}% over the soak)"
    )
    if samples:
        quarters = [samples[i * len(samples) // 4 : (i + 1) * len(samples) // 4] for i in range(4)]
        peaks = " / ".join(f"{max(q):.0f}" for q in quarters if q)
        print(f"server RSS peak per quarter of the soak (MiB): {peaks}")
    print(f"cache afterwards: {json.dumps(health)}")
    problems = list(tally.failures)
    if health.get("invariants") != "ok":
        problems.append(f"invariants: {health}")
    if health["locked_blocks"] != health["pinned_blocks"] or health["held_blocks"]:
        problems.append(f"blocks still locked or held: {health}")
    if health["running"] or health["waiting"] or health["queued"]:
        problems.append(f"requests still in the engine: {health}")
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        raise SystemExit(1)
    print("OK: no 500, every stream ended with [DONE], no block leaked, invariants hold")


if __name__ == "__main__":
    main()
