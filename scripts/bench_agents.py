"""Agents through tool pauses on the real engine: leases (`retain_for`) against LRU alone, on the engine's clock.

    python scripts/bench_agents.py [--model smollm2] [--agents 8] [--tasks 2] [--pool-contexts 3] [--markdown]

Eight agents share one system prompt and tool schemas (`--shared` tokens) and each works through `--tasks` tasks
of 3 to `--steps` steps: a call to the model (`--reply` greedy tokens), then a tool that runs for a pause drawn
log-uniformly from 2 to 30 s and returns `--tool-tokens` (16 to 96, log-uniform) tokens, then the same context
plus the tool's output. A task's last call ends it, and the agent starts its next task (a new task prompt after
the shared part) after one more pause; the finished task's context is dead weight for the cache. Each call but a
task's last asks for a lease of 30 s (the longest pause). Beside the agents, other traffic: a one-shot call of
`--background-tokens` unique prompt tokens every `--background-every` seconds (no lease), the pressure under
which LRU evicts a paused agent's context.

Time is the engine's lease clock, a virtual clock the script advances to each agent's next call (no real sleeps;
the model's compute takes no virtual time), and calls run one at a time in virtual-time order. The KV pool holds
`--pool-contexts` agents' largest contexts (shared part included); leases may take `--budget` of it.

Three engines see the same calls: LRU with leases, LRU alone (no `retain_for`), and the no-cache engine. For
every resumed call (a step after the first of a task) it reports the share of the previous call's context (prompt
and reply) that the cache served, and checks that every output equals the no-cache engine's (greedy, token ids).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # script_args, also when loaded by path (the tests)

from script_args import at_least, number

from radixcache.runtime.engine.engine import Engine

LEASE_S = 30.0
PAUSE_S = (2.0, 30.0)
TOOL_TOKENS = (16, 96)


@dataclass(frozen=True, slots=True)
class Step:
    pause_s: float  # the tool's run time after this call
    tool: tuple[int, ...]  # the tool's output, appended to the context


@dataclass(frozen=True, slots=True)
class Task:
    prompt: tuple[int, ...]  # the task's own start, after the shared part
    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Call:
    agent: int
    task: int
    step: int
    prompt_tokens: int
    cached_tokens: int
    previous_context: int  # the previous call's prompt and reply (0: a task's first call)
    output: tuple[int, ...]


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def plan(
    agents: int, tasks: int, steps: int, task_tokens: int, vocab: int, seed: int, tool: tuple[int, int] = TOOL_TOKENS
) -> list[list[Task]]:
    """Each agent's tasks: its prompt, and per step the pause and the tool's output (the same for every engine)."""
    rng = random.Random(seed)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(1, vocab) for _ in range(n))

    out = []
    for _ in range(agents):
        mine = []
        for _ in range(tasks):
            count = rng.randint(min(3, steps), steps)
            work = tuple(Step(log_uniform(rng, *PAUSE_S), tokens(round(log_uniform(rng, *tool)))) for _ in range(count))
            mine.append(Task(tokens(task_tokens), work))
        out.append(mine)
    return out


def largest_context(shared: int, tasks: list[list[Task]], reply: int) -> int:
    """The longest prompt any call sends (shared part, task, replies and tool outputs before its last step)."""
    return max(
        shared + len(t.prompt) + sum(reply + len(s.tool) for s in t.steps[:-1]) + reply for mine in tasks for t in mine
    )


def run_agents(
    engine: Engine,
    clock: VirtualClock,
    shared: tuple[int, ...],
    tasks: list[list[Task]],
    args: argparse.Namespace,
    lease: bool,
    vocab: int,
) -> list[Call]:
    """Every agent's calls, and the one-shot background calls, in virtual-time order (ties by agent; the background
    is agent -1), each run to its end before the next starts. The background stops when the last agent is done."""
    calls: list[Call] = []
    reply = args.reply
    state = {a: (0.0, 0, 0, list(shared) + list(tasks[a][0].prompt), 0) for a in range(len(tasks))}  # a -> next
    if args.background_every > 0:
        state[-1] = (args.background_every, 0, 0, [], 0)
    rng = random.Random(args.seed + 2000)
    while len(state) > (1 if -1 in state else 0):
        agent = min(state, key=lambda a: (state[a][0], a))
        at, k, j, context, previous = state.pop(agent)
        clock.now = max(clock.now, at)
        if agent < 0:  # a one-shot request from other traffic: its own prompt, no lease
            prompt = [rng.randrange(1, vocab) for _ in range(args.background_tokens)]
            r = engine.generate(prompt, 1)
            calls.append(Call(agent, k, 0, len(prompt), r.cached_tokens, 0, r.token_ids))
            state[agent] = (clock.now + args.background_every, k + 1, 0, [], 0)
            continue
        task = tasks[agent][k]
        last = j == len(task.steps) - 1
        hint = LEASE_S if lease and not last else None
        r = engine.generate(context, reply, ignore_eos=True, retain_for=hint)
        calls.append(Call(agent, k, j, len(context), r.cached_tokens, previous, r.token_ids))
        step = task.steps[j]
        if not last:
            grown = [*context, *r.token_ids]
            state[agent] = (clock.now + step.pause_s, k, j + 1, grown + list(step.tool), len(grown))
        elif k + 1 < len(tasks[agent]):
            state[agent] = (clock.now + step.pause_s, k + 1, 0, list(shared) + list(tasks[agent][k + 1].prompt), 0)
    return calls


def resumed_shares(calls: list[Call]) -> list[float]:
    """Each resumed call's cached tokens as a share of its previous call's context."""
    return [min(1.0, c.cached_tokens / c.previous_context) for c in calls if c.previous_context]


def summarise(label: str, calls: list[Call], reference: list[Call] | None, engine: Engine, wall_s: float) -> dict:
    shares = resumed_shares(calls)
    leases = engine.kv.leases
    return {
        "run": label,
        "resumed": len(shares),
        "mean_share": statistics.fmean(shares),
        "min_share": min(shares),
        "at_least_95": sum(s >= 0.95 for s in shares),
        "hit_rate": sum(c.cached_tokens for c in calls) / sum(c.prompt_tokens for c in calls),
        "outputs_equal": None if reference is None else [c.output for c in calls] == [c.output for c in reference],
        "leases": f"{leases.granted}/{leases.renewed}/{leases.expired}/{leases.given_way}",
        "wall_s": wall_s,
    }


def run_bench(model: Any, args: argparse.Namespace, vocab: int, out: Any = print) -> list[dict]:
    """Build the plan, run the three engines, print and return the rows."""
    rng = random.Random(args.seed + 1000)
    shared = tuple(rng.randrange(1, vocab) for _ in range(args.shared))
    tasks = plan(args.agents, args.tasks, args.steps, args.task_tokens, vocab, args.seed, tuple(args.tool_tokens))
    context = largest_context(args.shared, tasks, args.reply)
    pages = math.ceil(args.pool_contexts * context / args.page_size)
    out(
        f"{args.agents} agents x {args.tasks} tasks, {sum(len(t.steps) for m in tasks for t in m)} calls; largest "
        f"context {context} tokens; pool {pages} pages of {args.page_size} ({args.pool_contexts} contexts); "
        f"lease budget {args.budget}; a one-shot call of {args.background_tokens} tokens every "
        f"{args.background_every} s"
    )
    common = {"capacity_blocks": pages, "page_size": args.page_size, "dtype": "float32", **args.engine_kwargs}
    rows, reference = [], None
    for label, cache, lease in (("no cache", False, False), ("lru + leases", True, True), ("lru alone", True, False)):
        clock = VirtualClock()
        size = dict(common, capacity_blocks=max(pages, math.ceil(context / args.page_size) + 8))
        engine = Engine(model, enable_cache=cache, lease_fraction=args.budget, lease_clock=clock, **size)
        t0 = time.perf_counter()
        calls = run_agents(engine, clock, shared, tasks, args, lease, vocab)
        wall = time.perf_counter() - t0
        engine.check()
        if not cache:
            reference = calls
            engine.close()
            continue
        rows.append(summarise(label, calls, reference, engine, wall))
        engine.close()
    return rows


def table(rows: list[dict]) -> str:
    head = "| run | resumed calls | mean share cached | min share | calls >= 95% | hit rate | outputs = no cache | "
    head += "leases granted/renewed/expired/gave way |\n|---|---|---|---|---|---|---|---|\n"
    body = "".join(
        f"| {r['run']} | {r['resumed']} | {r['mean_share']:.3f} | {r['min_share']:.3f} | {r['at_least_95']} | "
        f"{r['hit_rate']:.3f} | {'yes' if r['outputs_equal'] else 'NO'} | {r['leases']} |\n"
        for r in rows
    )
    return head + body


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2", help="smollm2, a GGUF path, an HF directory, or tiny (random)")
    p.add_argument("--agents", type=at_least(1), default=8)
    p.add_argument("--tasks", type=at_least(1), default=2, help="tasks per agent, one after the other")
    p.add_argument("--steps", type=at_least(1), default=5, help="most calls per task (at least 3)")
    p.add_argument("--shared", type=at_least(0), default=1200, help="shared system prompt and tool schemas, tokens")
    p.add_argument("--task-tokens", type=at_least(1), default=60)
    p.add_argument("--reply", type=at_least(1), default=16, help="greedy tokens per call")
    p.add_argument("--tool-tokens", type=at_least(1), nargs=2, default=list(TOOL_TOKENS), metavar=("LO", "HI"))
    p.add_argument(
        "--pool-contexts",
        type=number(0, math.inf, above_low=True),
        default=3.0,
        help="the pool holds this many largest contexts",
    )
    p.add_argument("--budget", type=number(0, 1), default=0.8, help="lease_fraction of the pool")
    p.add_argument("--page-size", type=at_least(1), default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--background-every", type=number(0, math.inf), default=2.0, help="seconds between one-shot calls (0: none)"
    )
    p.add_argument("--background-tokens", type=at_least(1), default=256, help="prompt tokens of each one-shot call")
    p.add_argument("--threads", type=at_least(1), default=None, help="torch threads of each engine's loop")
    p.add_argument("--markdown", action="store_true", help="print only the Markdown table")
    args = p.parse_args(argv)
    if args.tool_tokens[0] > args.tool_tokens[1]:
        p.error(f"argument --tool-tokens: LO {args.tool_tokens[0]} is above HI {args.tool_tokens[1]}")
    args.engine_kwargs = {} if args.threads is None else {"threads": args.threads}
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.model == "tiny":  # the tests' random checkpoint: the same run in seconds (its outputs are noise)
        from radixcache.runtime.testing import tiny_model

        model: Any = tiny_model(seed=3)
    else:
        from radixcache.runtime.loading import load_model

        model = load_model(args.model)
    say = (lambda _: None) if args.markdown else print
    rows = run_bench(model, args, model.config.vocab_size, say)
    if not args.markdown:
        for r in rows:
            print(f"{r['run']}: {r['wall_s']:.1f} s wall")
    print(table(rows), end="")
    return 0 if all(r["outputs_equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
