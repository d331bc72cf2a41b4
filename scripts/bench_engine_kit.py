"""bench_engine.py's kit: the workload text (tool definitions, questions), small formatting helpers, and `Bench`,
the loaded model with the options that every measurement shares and the tables and JSON it reports into."""

from __future__ import annotations

import argparse
import random
from typing import Any

from radixcache.runtime import Engine
from radixcache.runtime.model.llama import LlamaModel

PAGE = 16

TOOLS = [
    "search(query: str) -> list of web results; fetch(url: str) -> page text; calculator(expr: str) -> number",
    "sql(query: str) -> rows from the sales database; plot(rows, x, y) -> image; email(to, subject, body)",
    "git_log(path) -> commits; read_file(path) -> text; run_tests(pattern) -> report; open_pr(title, body)",
    "weather(city) -> forecast; flights(src, dst, date) -> offers; book(offer_id) -> booking; calendar(day)",
]
QUESTIONS = [
    "What should I check first?",
    "Give me one concrete step.",
    "Why that one?",
    "And after that?",
    "Summarise in one line.",
]


def system_prompt(group: int, repeat: int) -> str:
    return (
        f"You are agent {group}, a careful assistant. Tools available: {TOOLS[group]}. "
        + "Answer briefly, call at most one tool per turn, and explain your reasoning. " * repeat
    )


def conversations(n: int, repeat: int) -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": system_prompt(i % 4, repeat)}] for i in range(n)]


def user_msg(session: int, turn: int) -> dict[str, str]:
    return {"role": "user", "content": f"Task {session}: {QUESTIONS[(session + turn) % len(QUESTIONS)]}"}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def passes(n: int) -> str:
    return f"{n} pass" if n == 1 else f"{n} passes"


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class Bench:
    """The loaded model, the options, and what every measurement reports (table lines and JSON)."""

    def __init__(self, args: argparse.Namespace, smol: Any, model: LlamaModel) -> None:
        self.args = args
        self.smol = smol
        self.model = model
        self.lines: list[str] = []
        self.data: dict[str, Any] = {}
        vocab = model.config.vocab_size
        eos = set(model.config.eos_token_ids) | set(getattr(smol.tokenizer, "eos_token_ids", ()) or ())
        lo = 32 if vocab > 1024 else 0  # past SmolLM2's special tokens
        self.vocab = [t for t in range(lo, vocab) if t not in eos]
        self.rng = random.Random(0)

    def engine(self, **kw: Any) -> Engine:
        kw.setdefault("capacity_blocks", self.args.kv_blocks)
        return Engine(self.model, tokenizer=self.smol.tokenizer, page_size=PAGE, **kw)

    def prompts(self, n: int, length: int, prefix: list[int] | None = None) -> list[list[int]]:
        """n random prompts of `length` tokens after `prefix`, distinct from their first token."""
        firsts = self.rng.sample(self.vocab, n)
        pre = list(prefix or [])
        return [[*pre, f, *self.rng.choices(self.vocab, k=length - 1)] for f in firsts]

    def table(self, head: list[str], rows: list[list[str]], title: str = "") -> None:
        out = [title, ""] if title else []
        out += ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        self.lines += [*out, ""]
