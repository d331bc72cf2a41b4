"""Seeded synthetic token workloads. The same arguments always give the same requests.

Every generator validates its arguments when called and returns an iterator that makes requests as they are
consumed, in arrival order: memory holds the conversations (agents, batches) still running, not the trace.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType

from radixcache.trace.agent_sessions import agent_sessions
from radixcache.trace.generator_args import check_generator_args, check_held, check_ints, check_units, most
from radixcache.trace.records import TokenRequest


def _tokens(rng: random.Random, n: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.randrange(vocab) for _ in range(n))


def _around(rng: random.Random, mean: int) -> int:
    """A length near `mean` (uniform within +-50%), at least 1."""
    return max(1, rng.randint(mean // 2, mean + mean // 2))


def _next_gap(rng: random.Random, mean_ms: float) -> float:
    return rng.expovariate(1.0 / mean_ms) if mean_ms > 0 else 0.0


#: a unit's requests keyed for arrival order: (key..., request), keys unique
Keyed = tuple
#: (floor, keyed requests): no request of this or any later unit has a key below floor
Unit = tuple[tuple, list[Keyed]]


def _in_key_order(units: Iterable[Unit]) -> Iterator[TokenRequest]:
    """Merge units (a conversation's turns, a batch) into key order, as a full sort of every request would.

    Requests keyed below the next unit's floor are final and leave; the heap holds only units still running.
    """
    heap: list[Keyed] = []
    for floor, keyed in units:
        while heap and heap[0][:-1] < floor:
            yield heapq.heappop(heap)[-1]
        for item in keyed:
            heapq.heappush(heap, item)
    while heap:
        yield heapq.heappop(heap)[-1]


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
) -> Iterator[TokenRequest]:
    """Multi-turn chats over shared system prompts, with interleaved arrivals.

    Conversations start as a Poisson process (`mean_interarrival_ms`). Each picks one of `system_prompts`
    shared prompts and runs a number of turns drawn from `turns` (inclusive). Turn i's prompt is the system
    prompt plus the whole history: every earlier user message and assistant reply, then the new user
    message. The next turn arrives after an exponential think time. Requests are yielded in arrival order
    (ties by conversation and turn), each with its recorded reply as `output_tokens`.
    """
    counts = {"conversations": conversations, "system_prompts": system_prompts, "turns": turns, "seed": seed}
    check_ints("multi_turn_chat", counts)
    if conversations < 0 or system_prompts < 1 or turns[0] < 1 or turns[1] < turns[0]:
        raise ValueError("multi_turn_chat: need conversations >= 0, system_prompts >= 1, 1 <= turns[0] <= turns[1]")
    check_units("multi_turn_chat", "conversations", conversations)
    lengths = {"system_tokens": system_tokens, "user_tokens": user_tokens, "assistant_tokens": assistant_tokens}
    times = {"mean_interarrival_ms": mean_interarrival_ms, "mean_think_ms": mean_think_ms}
    check_generator_args("multi_turn_chat", vocab, lengths, times)
    n = turns[1]  # turn i's prompt: the system prompt, i user messages and i - 1 replies
    a_conversation = (
        n * system_tokens + most(user_tokens) * n * (n + 1) // 2 + most(assistant_tokens) * n * (n - 1) // 2
    )
    held = {
        "system_prompts x system_tokens": system_prompts * system_tokens,
        "a conversation's prompts": a_conversation,
    }
    check_held("multi_turn_chat", held)

    def chats() -> Iterator[Unit]:
        rng = random.Random(seed)
        systems = [_tokens(rng, system_tokens, vocab) for _ in range(system_prompts)]
        start = 0.0
        for conv in range(conversations):
            start += _next_gap(rng, mean_interarrival_ms)
            history = systems[rng.randrange(system_prompts)]
            t = start
            keyed: list[Keyed] = []
            for turn in range(rng.randint(*turns)):
                prompt = history + _tokens(rng, _around(rng, user_tokens), vocab)
                reply = _tokens(rng, _around(rng, assistant_tokens), vocab)
                request = TokenRequest(round(t, 3), prompt, len(reply), session=f"chat-{conv}", output_tokens=reply)
                keyed.append((t, conv, turn, request))
                history = prompt + reply
                t += _next_gap(rng, mean_think_ms)
            yield (start, conv, 0), keyed

    return _in_key_order(chats())


def agent_loops(
    agents: int = 100,
    tool_prompts: int = 3,
    tool_tokens: int = 3000,
    task_tokens: int = 200,
    steps: tuple[int, int] = (3, 8),
    action_tokens: int = 120,
    observation_tokens: int = 300,
    fanout: tuple[int, int] = (2, 4),
    fanout_prob: float = 0.3,
    branch_tokens: int = 40,
    mean_interarrival_ms: float = 1000.0,
    mean_step_ms: float = 3000.0,
    vocab: int = 32000,
    seed: int = 0,
) -> Iterator[TokenRequest]:
    """Tool-using agents: a long shared tool/system prompt, a scratchpad that grows each step, and fan-out.

    Agents start as a Poisson process. Each uses one of `tool_prompts` shared tool prompts plus its own task.
    Step i's prompt is tools + task + scratchpad; its recorded output is the next action, and the scratchpad
    grows by that action and an observation. With probability `fanout_prob` a step instead fans out into
    parallel branches (same arrival time, same prefix, a short distinct instruction each), and the scratchpad
    grows by every branch's output. Requests are yielded in arrival order.
    """
    counts = {"agents": agents, "tool_prompts": tool_prompts, "steps": steps, "fanout": fanout, "seed": seed}
    check_ints("agent_loops", counts)
    if agents < 0 or tool_prompts < 1 or steps[0] < 1 or steps[1] < steps[0] or fanout[0] < 1 or fanout[1] < fanout[0]:
        raise ValueError("agent_loops: need agents >= 0, tool_prompts >= 1, 1 <= steps[0] <= steps[1], fanout likewise")
    check_units("agent_loops", "agents", agents)
    lengths = {
        "tool_tokens": tool_tokens,
        "task_tokens": task_tokens,
        "action_tokens": action_tokens,
        "observation_tokens": observation_tokens,
        "branch_tokens": branch_tokens,
    }
    times = {"mean_interarrival_ms": mean_interarrival_ms, "mean_step_ms": mean_step_ms}
    check_generator_args("agent_loops", vocab, lengths, times, {"fanout_prob": fanout_prob})
    n, width = steps[1], fanout[1] if fanout_prob > 0 else 1  # step i: up to `width` prompts, i steps' growth each
    grows = max(width * most(action_tokens), most(action_tokens) + most(observation_tokens))
    start = tool_tokens + most(task_tokens) + most(branch_tokens)
    held = {"tool_prompts x tool_tokens": tool_prompts * tool_tokens, "an agent's prompts": width * n * start}
    held["an agent's prompts"] += width * grows * n * (n - 1) // 2
    check_held("agent_loops", held)

    def loops() -> Iterator[Unit]:
        rng = random.Random(seed)
        tools = [_tokens(rng, tool_tokens, vocab) for _ in range(tool_prompts)]
        start = 0.0
        for agent in range(agents):
            start += _next_gap(rng, mean_interarrival_ms)
            context = tools[rng.randrange(tool_prompts)] + _tokens(rng, _around(rng, task_tokens), vocab)
            t = start
            keyed: list[Keyed] = []
            for step in range(rng.randint(*steps)):
                if rng.random() < fanout_prob:
                    merged: tuple[int, ...] = ()
                    for branch in range(rng.randint(*fanout)):
                        prompt = context + _tokens(rng, _around(rng, branch_tokens), vocab)
                        out = _tokens(rng, _around(rng, action_tokens), vocab)
                        request = TokenRequest(round(t, 3), prompt, len(out), f"agent-{agent}", output_tokens=out)
                        keyed.append((t, agent, step, branch, request))
                        merged += out
                    context = context + merged
                else:
                    out = _tokens(rng, _around(rng, action_tokens), vocab)
                    request = TokenRequest(round(t, 3), context, len(out), f"agent-{agent}", output_tokens=out)
                    keyed.append((t, agent, step, 0, request))
                    context = context + out + _tokens(rng, _around(rng, observation_tokens), vocab)
                t += _next_gap(rng, mean_step_ms)
            yield (start, agent, 0, 0), keyed

    return _in_key_order(loops())


def rag(
    queries: int = 1000,
    documents: int = 300,
    docs_per_query: tuple[int, int] = (3, 6),
    doc_tokens: int = 500,
    system_tokens: int = 300,
    question_tokens: int = 60,
    answer_tokens: int = 120,
    zipf: float = 1.1,
    order_noise: float = 2.0,
    mean_interarrival_ms: float = 100.0,
    vocab: int = 32000,
    seed: int = 0,
) -> Iterator[TokenRequest]:
    """Retrieval-augmented queries: a shared system prompt, then shared documents in varying order, then a question.

    Documents are retrieved with Zipf popularity (exponent `zipf`), several per query without repeats, and put
    in the prompt ordered by a noisy relevance score (rank plus Gaussian noise of `order_noise` ranks), so the
    same documents often appear in a different order and share only a part of the prefix. Poisson arrivals,
    so queries are yielded as they are made.
    """
    check_ints("rag", {"queries": queries, "documents": documents, "docs_per_query": docs_per_query, "seed": seed})
    lo, hi = docs_per_query
    if queries < 0 or documents < 1 or lo < 1 or hi < lo or hi > documents:
        raise ValueError("rag: need queries >= 0, 1 <= docs_per_query[0] <= docs_per_query[1] <= documents")
    check_units("rag", "queries", queries)
    lengths = {
        "doc_tokens": doc_tokens,
        "system_tokens": system_tokens,
        "question_tokens": question_tokens,
        "answer_tokens": answer_tokens,
    }
    times = {"mean_interarrival_ms": mean_interarrival_ms, "order_noise": order_noise}
    check_generator_args("rag", vocab, lengths, times)
    check_held("rag", {"documents x doc_tokens": documents * most(doc_tokens)})  # a prompt: a few of them
    weights = _zipf_weights(documents, zipf, hi)

    def queried() -> Iterator[TokenRequest]:
        rng = random.Random(seed)
        system = _tokens(rng, system_tokens, vocab)
        docs = [_tokens(rng, _around(rng, doc_tokens), vocab) for _ in range(documents)]
        t = 0.0
        for query in range(queries):
            t += _next_gap(rng, mean_interarrival_ms)
            chosen: list[int] = []
            want = rng.randint(lo, hi)
            while len(chosen) < want:
                doc = rng.choices(range(documents), weights)[0]
                if doc not in chosen:
                    chosen.append(doc)
            chosen.sort(key=lambda d: d + rng.gauss(0.0, order_noise))
            prompt = system
            for doc in chosen:
                prompt += docs[doc]
            prompt += _tokens(rng, _around(rng, question_tokens), vocab)
            answer = _tokens(rng, _around(rng, answer_tokens), vocab)
            yield TokenRequest(round(t, 3), prompt, len(answer), f"rag-{query}", output_tokens=answer)

    return queried()


def _zipf_weights(documents: int, zipf: float, picks: int) -> list[float]:
    """Zipf popularity by rank, or ValueError when `zipf` leaves fewer than `picks` documents a finite, non-zero
    weight (one query draws `picks` distinct documents: it would never finish) or overflows a float."""
    try:
        weights = [1.0 / (rank + 1) ** zipf for rank in range(documents)]
    except (OverflowError, ZeroDivisionError):
        weights = []
    if not math.isfinite(sum(weights)) or sum(w > 0 for w in weights) < picks:
        raise ValueError(f"rag: zipf {zipf!r} leaves fewer than {picks} of the {documents} documents a usable weight")
    return weights


def few_shot(
    batches: int = 150,
    tasks: int = 10,
    pool: int = 16,
    shots: tuple[int, int] = (4, 8),
    fixed_shots_prob: float = 0.5,
    instruction_tokens: int = 150,
    example_tokens: int = 120,
    batch_size: tuple[int, int] = (4, 16),
    query_tokens: int = 50,
    answer_tokens: int = 20,
    mean_interarrival_ms: float = 1000.0,
    vocab: int = 32000,
    seed: int = 0,
) -> Iterator[TokenRequest]:
    """Few-shot batches: a task instruction and k examples shared by a batch of queries sent together.

    Each batch picks one of `tasks` tasks. With probability `fixed_shots_prob` it uses the task's canonical
    first k examples in order (shared with other batches of the task), otherwise k examples sampled from the
    task's pool of `pool`, in random order. Query i of a batch arrives i ms after the batch, so close batches
    interleave; requests are yielded by timestamp, ties in batch order.
    """
    counts = {"batches": batches, "tasks": tasks, "pool": pool, "shots": shots, "batch_size": batch_size, "seed": seed}
    check_ints("few_shot", counts)
    if batches < 0 or tasks < 1 or shots[0] < 0 or shots[1] < shots[0] or shots[1] > pool:
        raise ValueError("few_shot: need batches >= 0, tasks >= 1, 0 <= shots[0] <= shots[1] <= pool")
    check_units("few_shot", "batches", batches)
    if batch_size[0] < 1 or batch_size[1] < batch_size[0]:
        raise ValueError("few_shot: need 1 <= batch_size[0] <= batch_size[1]")
    lengths = {
        "instruction_tokens": instruction_tokens,
        "example_tokens": example_tokens,
        "query_tokens": query_tokens,
        "answer_tokens": answer_tokens,
    }
    shares = {"fixed_shots_prob": fixed_shots_prob}
    check_generator_args("few_shot", vocab, lengths, {"mean_interarrival_ms": mean_interarrival_ms}, shares)
    prompt = instruction_tokens + shots[1] * most(example_tokens) + most(query_tokens)
    held = {
        "tasks x (instruction_tokens + pool x example_tokens)": tasks
        * (instruction_tokens + pool * most(example_tokens)),
        "a batch's prompts": batch_size[1] * prompt,
    }
    check_held("few_shot", held)

    def batched() -> Iterator[Unit]:
        rng = random.Random(seed)
        instructions = [_tokens(rng, instruction_tokens, vocab) for _ in range(tasks)]
        examples = [[_tokens(rng, _around(rng, example_tokens), vocab) for _ in range(pool)] for _ in range(tasks)]
        t = 0.0
        for batch in range(batches):
            t += _next_gap(rng, mean_interarrival_ms)
            task = rng.randrange(tasks)
            k = rng.randint(*shots)
            picked = list(range(k)) if rng.random() < fixed_shots_prob else rng.sample(range(pool), k)
            prefix = instructions[task]
            for example in picked:
                prefix += examples[task][example]
            keyed: list[Keyed] = []
            for i in range(rng.randint(*batch_size)):
                prompt = prefix + _tokens(rng, _around(rng, query_tokens), vocab)
                answer = _tokens(rng, _around(rng, answer_tokens), vocab)
                stamp = round(t + i, 3)
                keyed.append(
                    (
                        stamp,
                        batch,
                        i,
                        TokenRequest(stamp, prompt, len(answer), f"fewshot-{batch}", output_tokens=answer),
                    )
                )
            yield (round(t, 3), batch, 0), keyed

    return _in_key_order(batched())


#: generator name -> function, for the CLI and the sweep
GENERATORS: Mapping[str, Callable[..., Iterator[TokenRequest]]] = MappingProxyType(
    {
        "chat": multi_turn_chat,
        "agent": agent_loops,
        "agent-sessions": agent_sessions,
        "rag": rag,
        "few-shot": few_shot,
    }
)
