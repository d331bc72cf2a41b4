"""Seeded synthetic token workloads. The same arguments always give the same requests."""

from __future__ import annotations

import random

from radixcache.records import TokenRequest


def _tokens(rng: random.Random, n: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.randrange(vocab) for _ in range(n))


def _around(rng: random.Random, mean: int) -> int:
    """A length near `mean` (uniform within +-50%), at least 1."""
    return max(1, rng.randint(mean // 2, mean + mean // 2))


def multi_turn_chat(
    conversations: int = 200,
    system_prompts: int = 5,
    system_tokens: int = 500,
    turns: tuple[int, int] = (4, 8),
    user_tokens: int = 100,
    assistant_tokens: int = 150,
    mean_interarrival_ms: float = 200.0,
    mean_think_ms: float = 5000.0,
    vocab: int = 32000,
    seed: int = 0,
) -> list[TokenRequest]:
    """Multi-turn chats over shared system prompts, with interleaved arrivals.

    Conversations start as a Poisson process (`mean_interarrival_ms`). Each picks one of `system_prompts`
    shared prompts and runs a number of turns drawn from `turns` (inclusive). Turn i's prompt is the system
    prompt plus the whole history: every earlier user message and assistant reply, then the new user
    message. The next turn arrives after an exponential think time. Requests come back in arrival order
    (ties by conversation and turn), each with its recorded reply as `output_tokens`.
    """
    if conversations < 0 or system_prompts < 1 or turns[0] < 1 or turns[1] < turns[0]:
        raise ValueError("multi_turn_chat: need conversations >= 0, system_prompts >= 1, 1 <= turns[0] <= turns[1]")
    rng = random.Random(seed)
    systems = [_tokens(rng, system_tokens, vocab) for _ in range(system_prompts)]
    timed: list[tuple[float, int, int, TokenRequest]] = []
    start = 0.0
    for conv in range(conversations):
        start += rng.expovariate(1.0 / mean_interarrival_ms) if mean_interarrival_ms > 0 else 0.0
        history = systems[rng.randrange(system_prompts)]
        t = start
        for turn in range(rng.randint(*turns)):
            prompt = history + _tokens(rng, _around(rng, user_tokens), vocab)
            reply = _tokens(rng, _around(rng, assistant_tokens), vocab)
            request = TokenRequest(round(t, 3), prompt, len(reply), session=f"chat-{conv}", output_tokens=reply)
            timed.append((t, conv, turn, request))
            history = prompt + reply
            t += rng.expovariate(1.0 / mean_think_ms) if mean_think_ms > 0 else 0.0
    timed.sort(key=lambda item: item[:3])
    return [item[3] for item in timed]
