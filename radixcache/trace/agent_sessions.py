"""Agent sessions with timed tool pauses and lease hints (`agent_sessions`).

Each of `agents` agents runs `steps` steps. All agents share one system prompt and one block of tool schemas
(`system_tokens`, `tools_tokens`); each adds its own task. Step i's prompt is the whole context so far; the model's
reply (`action_tokens`, uniform within +-50%) is recorded as the output; then a tool runs for a pause drawn
log-uniformly from `pause_s` (seconds: `exp(U(ln lo, ln hi))`, so every octave is equally likely) and returns an
output whose length is drawn log-uniformly from `tool_output_tokens`; the next step arrives when the pause ends.
Agents start `mean_interarrival_ms` apart on average (exponential gaps).

Each request carries a lease hint, `TokenRequest.retain_for` seconds: the pause that follows it, times a
log-uniform error factor from `[1/hint_error, hint_error]` (1 gives the exact pause); a session's last request
has none (None).
Arrival times are on the trace clock (milliseconds); the generator is deterministic per seed.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator

from radixcache.trace.generator_args import (
    MAX_RETAIN_FOR_S,
    MAX_TRACE_TOKENS,
    check_generator_args,
    check_held,
    check_ints,
    most,
)
from radixcache.trace.records import TokenRequest


def log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    """A draw from the log-uniform distribution on [lo, hi] (lo > 0)."""
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def agent_sessions(
    agents: int = 8,
    steps: tuple[int, int] = (4, 8),
    system_tokens: int = 600,
    tools_tokens: int = 1200,
    task_tokens: int = 200,
    action_tokens: int = 120,
    pause_s: tuple[float, float] = (2.0, 30.0),
    tool_output_tokens: tuple[int, int] = (50, 800),
    mean_interarrival_ms: float = 2000.0,
    hint_error: float = 1.0,
    vocab: int = 32000,
    seed: int = 0,
) -> Iterator[TokenRequest]:
    """The requests of `agents` agent sessions in arrival order, each with its lease hint (see the module doc)."""
    counts = {"agents": agents, "steps": steps, "tool_output_tokens": tool_output_tokens, "seed": seed}
    check_ints("agent_sessions", counts)
    if agents < 0 or not 1 <= steps[0] <= steps[1]:
        raise ValueError("agent_sessions: need agents >= 0 and 1 <= steps[0] <= steps[1]")
    if not 0 < pause_s[0] <= pause_s[1] or not 1 <= tool_output_tokens[0] <= tool_output_tokens[1]:
        raise ValueError("agent_sessions: need 0 < pause_s[0] <= pause_s[1] and 1 <= tool_output_tokens[0] <= [1]")
    if not 1 <= hint_error < math.inf:
        raise ValueError(f"agent_sessions: hint_error must be finite and >= 1, got {hint_error!r}")
    if not pause_s[1] * hint_error <= MAX_RETAIN_FOR_S:  # a hint is at most this: the readers refuse a longer one
        raise ValueError(f"agent_sessions: need pause_s[1] * hint_error <= {MAX_RETAIN_FOR_S:g} seconds")
    lengths = {
        "system_tokens": system_tokens,
        "tools_tokens": tools_tokens,
        "task_tokens": task_tokens,
        "action_tokens": action_tokens,
    }
    check_generator_args("agent_sessions", vocab, lengths, {"mean_interarrival_ms": mean_interarrival_ms})
    n, grows = steps[1], most(action_tokens) + tool_output_tokens[1]
    first = system_tokens + tools_tokens + most(task_tokens)
    an_agent = n * first + grows * n * (n - 1) // 2
    check_held("agent_sessions", {"an agent's prompts": an_agent})
    # every agent's requests are made before the first is yielded: the whole trace is held
    check_held("agent_sessions", {"agents x an agent's prompts": agents * an_agent}, MAX_TRACE_TOKENS)
    rng = random.Random(seed)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(vocab) for _ in range(n))

    shared = tokens(system_tokens) + tokens(tools_tokens)
    keyed: list[tuple[float, int, int, TokenRequest]] = []
    start = 0.0
    for agent in range(agents):
        start += rng.expovariate(1.0 / mean_interarrival_ms) if mean_interarrival_ms > 0 else 0.0
        context = shared + tokens(max(1, rng.randint(task_tokens // 2, task_tokens + task_tokens // 2)))
        t = start
        count = rng.randint(*steps)
        for step in range(count):
            out = tokens(max(1, rng.randint(action_tokens // 2, action_tokens + action_tokens // 2)))
            pause = log_uniform(rng, *pause_s)
            size = round(log_uniform(rng, *tool_output_tokens))
            hint = None if step == count - 1 else pause * log_uniform(rng, 1 / hint_error, hint_error)
            request = TokenRequest(round(t, 3), context, len(out), f"agent-{agent}", output_tokens=out, retain_for=hint)
            keyed.append((round(t, 3), agent, step, request))
            context = context + out + tokens(size)
            t += pause * 1000.0
    heapq.heapify(keyed)
    return iter([heapq.heappop(keyed)[3] for _ in range(len(keyed))])
