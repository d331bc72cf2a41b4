"""Age-aware class oracles on a hash trace: what knowing *when* a block returns is worth (issue 17's study, continued).

`lru-dead` knows *whether* a block is read again; a class oracle knows each class's share of reused blocks. This
study ranks cached blocks by what an EVA/LHD-style policy estimates (Beckmann and Sanchez, "Maximizing cache
performance under uncertainty"): the survival curve of a block's reuse interval (requests until its next read, or
never) per class, read at the block's age (requests since its last access).

- Classes: the request that last read the block: its size (log2 blocks), whether its first block was new to the
  trace, its output length (log2), and the block's reads so far (0, 1, 2, 3+). A class with fewer than
  `--min-events` intervals at risk at the queried age backs off to (output length, reads), then to reads alone.
- Scores (the lowest goes first, ties by LRU, then deepest first): `p`, the probability of a read within the next
  H requests; `eva`, that probability less `g` times the expected requests the block would hold its place (g: LRU's
  block hits per request per cached block at that capacity).
- Calibration: the curves are Kaplan-Meier estimates from the intervals that start before a cut-off request,
  censored there. `in-sample` cuts at the end of the trace: an oracle, since it is scored on the requests it was
  fitted to. `first-half` cuts at the middle, and hits are then counted on the second half only (LRU and Belady
  too), which is what a policy that learned from the past and then stopped learning would see. `online` refits
  at the first eviction of every `--refit` requests on everything before it (LRU until request `--refit`): a
  learner with unbounded bookkeeping that sees only the past. (Every `eva` column takes `g` from LRU's replay of
  the same requests, a figure an online policy would have to estimate.)

The replay is the simulator's at concurrency 1 on a hash trace (radixcache.sim.cache_replay: match the prompt's cached
prefix, lock it, evict unlocked childless blocks one at a time, insert the rest), over single blocks with numpy;
its LRU, Belady and lru-dead figures are the simulator's (tests/sim/test_study_age_oracle.py checks that). Usage:
    .venv/bin/python scripts/study_age_oracle.py ../shared/traces/mooncake_synthetic_trace.jsonl
"""

from __future__ import annotations

import argparse
import heapq
from collections.abc import Callable

import numpy as np
from script_args import at_least

from radixcache.sim.sweep import capacities_for, study_fractions, study_workload
from radixcache.trace.workload import Workload

FEATURES = ("size", "root", "out", "count")
NEVER = 1 << 40  # "no further read": later than any request index


class TraceArrays:
    """A hash workload as arrays: dense block ids, each request's path, and every read (an *occurrence*)."""

    def __init__(self, workload: Workload) -> None:
        requests = workload.requests
        dense: dict[int, int] = {}
        self.paths = [np.array([dense.setdefault(h, len(dense)) for h in r.prompt], dtype=np.int64) for r in requests]
        self.n = len(self.paths)
        self.unique = u = len(dense)
        self.prompt_tokens = np.array([r.prompt_tokens for r in requests], dtype=np.int64)
        self.unit = np.array([r.unit for r in requests], dtype=np.int64)
        self.parent = np.full(u, u, dtype=np.int64)  # u: the root
        self.depth = np.zeros(u, dtype=np.int64)
        for path in self.paths:
            self.parent[path[1:]] = path[:-1]
            self.depth[path] = np.arange(1, len(path) + 1)
        lengths = np.array([len(p) for p in self.paths], dtype=np.int64)
        self.start = np.zeros(self.n + 1, dtype=np.int64)  # request i's reads are occurrences start[i]:start[i + 1]
        np.cumsum(lengths, out=self.start[1:])
        self.req = np.repeat(np.arange(self.n, dtype=np.int64), lengths)
        block = np.concatenate(self.paths) if self.paths else np.zeros(0, dtype=np.int64)
        order = np.lexsort((self.req, block))  # by block, then request
        same = block[order[1:]] == block[order[:-1]]
        self.next = np.full(len(block), NEVER, dtype=np.int64)  # the request of the block's next read
        self.next[order[:-1][same]] = self.req[order[1:][same]]
        seen_before = np.zeros(len(block), dtype=bool)
        seen_before[order[1:][same]] = True
        first = np.ones(len(order), dtype=bool)
        first[1:] = ~same
        group_start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        self.reads_before = np.zeros(len(block), dtype=np.int64)
        self.reads_before[order] = np.arange(len(order)) - group_start
        outputs = [r.output_tokens or 0 for r in requests]
        self.features = {
            "size": np.array([int(n).bit_length() for n in lengths], dtype=np.int64)[self.req],
            "root": np.array(
                [len(p) > 0 and not seen_before[self.start[i]] for i, p in enumerate(self.paths)], dtype=np.int64
            )[self.req],
            "out": np.array([int(o).bit_length() for o in outputs], dtype=np.int64)[self.req],
            "count": np.minimum(self.reads_before, 3),
        }


class SurvivalModel:
    """Kaplan-Meier survival of the reuse interval per class, fitted on the reads before request `cut`.

    Levels from fine to coarse: the given features, then (out, count), then count; a class with fewer than
    `min_events` intervals at risk at the queried age is read at the next level.
    """

    def __init__(self, trace: TraceArrays, features: tuple[str, ...], cut: int, min_events: int = 30) -> None:
        self.n, self.min_events, self.g = trace.n, min_events, 0.0
        n = trace.n
        fitted = trace.req < cut
        observed = fitted & (trace.next < cut)
        interval = np.where(observed, trace.next - trace.req, 0)
        censored_at = np.where(fitted & ~observed, cut - 1 - trace.req, -1)  # known only: interval > censored_at
        levels = [features, tuple(f for f in ("out", "count") if f in features), ("count",)]
        self.levels = []
        for keys in levels:
            code = np.zeros(len(trace.req), dtype=np.int64)
            for key in keys:
                code = code * 64 + trace.features[key]
            _, klass = np.unique(code, return_inverse=True)
            classes = int(klass.max()) + 1 if len(klass) else 1
            events = np.zeros((classes, n + 2))
            np.add.at(events, (klass[observed], interval[observed]), 1)
            censored = np.zeros((classes, n + 2))
            keep = censored_at >= 0
            np.add.at(censored, (klass[keep], censored_at[keep]), 1)
            at_risk = np.cumsum((events + censored)[:, ::-1], axis=1)[:, ::-1]  # at_risk[a]: interval >= a
            hazard = np.divide(events, at_risk, out=np.zeros_like(events), where=at_risk > 0)
            total = at_risk[:, 1]
            survivors = np.cumprod(1 - hazard, axis=1)[:, : n + 1] * total[:, None]  # [a]: interval > a
            survivors[:, 0] = total
            cumulative = np.zeros((classes, n + 2))  # [a]: survivors summed over ages below a
            cumulative[:, 1:] = np.cumsum(survivors, axis=1)
            risk = np.zeros((classes, n + 1))
            risk[:, :n] = at_risk[:, 1 : n + 1]
            self.levels.append((klass, survivors, cumulative, risk))

    def _at(self, table: np.ndarray, klass: np.ndarray, age: np.ndarray) -> np.ndarray:
        return table[klass, np.minimum(age, table.shape[1] - 1)]

    def score(self, occurrence: np.ndarray, age: np.ndarray, horizon: int, kind: str) -> np.ndarray:
        """Per block (the occurrence of its last read, its age in requests): the value of keeping it (high: keep)."""
        out = np.zeros(len(occurrence))
        todo = np.ones(len(occurrence), dtype=bool)
        for level, (klass, survivors, cumulative, risk) in enumerate(self.levels):
            c = klass[occurrence]
            ok = todo & ((self._at(risk, c, age) >= self.min_events) | (level == len(self.levels) - 1))
            if not ok.any():
                continue
            c, a = c[ok], age[ok]
            alive = np.maximum(self._at(survivors, c, a), 1e-9)
            p = (alive - self._at(survivors, c, a + horizon)) / alive
            if kind == "eva":
                held = (self._at(cumulative, c, a + horizon) - self._at(cumulative, c, a)) / alive
                p = p - self.g * held
            out[ok] = p
            todo &= ~ok
        return out


Ranker = Callable[[np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]  # (blocks, last read, next read, now)


def lru(blocks: np.ndarray, last_read: np.ndarray, next_read: np.ndarray, now: int) -> np.ndarray:
    return np.zeros(len(blocks))


def belady(blocks: np.ndarray, last_read: np.ndarray, next_read: np.ndarray, now: int) -> np.ndarray:
    return -next_read[blocks].astype(np.float64)


def lru_dead(blocks: np.ndarray, last_read: np.ndarray, next_read: np.ndarray, now: int) -> np.ndarray:
    return (next_read[blocks] < NEVER).astype(np.float64)


def replay(
    trace: TraceArrays, capacity: int, ranker: Ranker | None = None, measure_from: int = 0
) -> tuple[float, float]:
    """(token hit rate, LRU-comparable block hits per request per cached block) of one replay; `ranker`'s score
    orders eviction (lowest first, then least recently read, then deepest). Hits count from `measure_from` on."""
    keys = ranker or lru
    u = trace.unique
    cached = np.zeros(u + 1, dtype=bool)
    children = np.zeros(u + 1, dtype=np.int64)
    last_request = np.full(u + 1, -1, dtype=np.int64)
    last_read = np.zeros(u + 1, dtype=np.int64)  # the occurrence of the block's last read
    next_read = np.full(u + 1, NEVER, dtype=np.int64)
    locked = np.zeros(u + 1, dtype=bool)
    parent, depth = trace.parent, trace.depth
    held = hit_tokens = prompt_tokens = hit_blocks = 0

    for i, path in enumerate(trace.paths):
        on = cached[path]
        matched = len(path) if on.all() else int(np.argmin(on))
        if i >= measure_from:
            prompt_tokens += int(trace.prompt_tokens[i])
            hit_tokens += min(matched * int(trace.unit[i]), int(trace.prompt_tokens[i]))
            hit_blocks += matched
        first = trace.start[i]
        reads = first + np.arange(len(path))
        hit = path[:matched]
        last_request[hit], last_read[hit], next_read[hit] = i, reads[:matched], trace.next[reads[:matched]]
        locked[hit] = True
        need = min(len(path), capacity) - matched
        short = need - (capacity - held)
        if short > 0:  # evict one childless unlocked block at a time; a parent left childless joins the candidates
            blocks = np.flatnonzero(cached[:u] & (children[:u] == 0) & ~locked[:u])
            score = keys(blocks, last_read, next_read, i)
            order = np.lexsort((-depth[blocks], last_request[blocks], score))
            queue = list(
                zip(
                    score[order].tolist(),
                    last_request[blocks[order]].tolist(),
                    (-depth[blocks[order]]).tolist(),
                    blocks[order].tolist(),
                    strict=True,
                )
            )
            heapq.heapify(queue)  # already sorted: a heap as it stands
            for _ in range(short):
                block = heapq.heappop(queue)[3]
                cached[block] = False
                up = parent[block]
                children[up] -= 1
                if up != u and children[up] == 0 and not locked[up]:
                    score_up = float(keys(np.array([up]), last_read, next_read, i)[0])
                    entry = (score_up, int(last_request[up]), -int(depth[up]), int(up))
                    heapq.heappush(queue, entry)
            held -= short
        if need > 0:
            new = path[matched : matched + need]
            cached[new] = True
            children[parent[new]] += 1
            last_request[new], last_read[new] = i, reads[matched : matched + need]
            next_read[new] = trace.next[reads[matched : matched + need]]
            held += need
        locked[hit] = False
    return hit_tokens / max(prompt_tokens, 1), hit_blocks / max(trace.n - measure_from, 1) / capacity


def age_ranker(model: SurvivalModel, trace: TraceArrays, horizon: int, kind: str) -> Ranker:
    """Rank blocks by `model`'s score at their age (requests since their last read)."""

    def rank(blocks: np.ndarray, last_read: np.ndarray, next_read: np.ndarray, now: int) -> np.ndarray:
        occurrence = last_read[blocks]
        return model.score(occurrence, now - trace.req[occurrence], horizon, kind)

    return rank


def online_ranker(
    trace: TraceArrays, features: tuple[str, ...], min_events: int, g: float, refit: int, horizon: int, kind: str
) -> Ranker:
    """Rank as `age_ranker` does with a model refitted on all reads before the current request, at the first
    eviction in each new span of `refit` requests; LRU before the first refit."""
    state: dict[str, object] = {"span": 0, "rank": lru}

    def rank(blocks: np.ndarray, last_read: np.ndarray, next_read: np.ndarray, now: int) -> np.ndarray:
        span = now // refit
        if span != state["span"]:
            model = SurvivalModel(trace, features, now, min_events)
            model.g = g
            state["span"], state["rank"] = span, age_ranker(model, trace, horizon, kind)
        return state["rank"](blocks, last_read, next_read, now)  # type: ignore[operator]

    return rank


def drift(trace: TraceArrays, within: int = 200) -> str:
    """Per quarter of the trace: the share of reads read again within `within` requests, for all reads, for first
    reads of a block, and for the rest (a model fitted on the past assumes these stay put)."""
    soon = (trace.next - trace.req) <= within
    firsts = trace.reads_before == 0
    cells = []
    for q in range(4):
        part = (trace.req >= q * trace.n // 4) & (trace.req < (q + 1) * trace.n // 4)
        shares = [soon[part & mask].mean() if (part & mask).any() else 0.0 for mask in (True, firsts, ~firsts)]
        cells.append("/".join(f"{x * 100:.0f}%" for x in shares))
    return f"# read again within {within} requests (all/first reads/later reads), by quarter: " + ", ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a Mooncake-format hash trace")
    ap.add_argument("--fractions", default="0.02,0.05,0.1,0.2", help="capacities as shares of the unique blocks")
    ap.add_argument("--block-size", type=int, default=512)
    ap.add_argument("--scores", default="p:200,eva:600", help="KIND:H pairs; KIND is p or eva, H in requests")
    ap.add_argument("--features", default=",".join(FEATURES), help=f"class features, from {', '.join(FEATURES)}")
    ap.add_argument(
        "--min-events", type=at_least(0), default=30, help="intervals at risk a class needs, else backs off"
    )
    ap.add_argument("--refit", type=at_least(1), default=100, help="online: refit every this many requests")
    args = ap.parse_args()
    fractions = study_fractions(ap, args)
    features = tuple(f for f in args.features.split(",") if f)
    unknown = [f for f in features if f not in FEATURES]
    if unknown:
        ap.error(f"--features: unknown feature {unknown[0]!r}; choose from {', '.join(FEATURES)}")
    pairs = [s.partition(":") for s in args.scores.split(",") if s]
    # H was int()'s traceback when not a number, and a horizon of 0 requests ran on
    if not pairs or any(kind not in ("p", "eva") or not h.isdigit() or int(h) < 1 for kind, _, h in pairs):
        ap.error(f"--scores: each score is p:H or eva:H with H an int >= 1, got {args.scores!r}")
    scores = [(kind, int(h)) for kind, _, h in pairs]
    workload = study_workload(ap, args)
    trace = TraceArrays(workload)
    half = trace.n // 2
    models = {"in-sample": SurvivalModel(trace, features, trace.n, args.min_events)}
    models["first-half"] = SurvivalModel(trace, features, half, args.min_events)
    columns = [f"{kind} H={h} {name}" for kind, h in scores for name in (*models, "online")]
    print(f"# {trace.n} requests, {trace.unique} unique blocks; classes: {', '.join(features)}")
    print(drift(trace))
    print(
        "# first-half: fitted on requests before the middle; it, and the LRU and Belady beside it, count hits after it"
    )
    print("| capacity | lru | belady | lru-dead | " + " | ".join(columns) + " | lru (2nd half) | belady (2nd half) |")
    print("|---:|" + "---:|" * (len(columns) + 5))
    for capacity in capacities_for(workload, fractions):
        base, g = replay(trace, capacity)
        bound = replay(trace, capacity, belady)[0]
        dead = replay(trace, capacity, lru_dead)[0]
        base_half, g_half = replay(trace, capacity, measure_from=half)
        bound_half = replay(trace, capacity, belady, measure_from=half)[0]
        row = [str(capacity), f"{base * 100:.2f}%", f"{bound * 100:.2f}%", _cell(dead, base, bound)]
        for kind, h in scores:
            for name, model in models.items():
                start = half if name == "first-half" else 0
                model.g = g_half if start else g
                rate = replay(trace, capacity, age_ranker(model, trace, h, kind), measure_from=start)[0]
                row.append(_cell(rate, base_half, bound_half) if start else _cell(rate, base, bound))
            ranker = online_ranker(trace, features, args.min_events, g, args.refit, h, kind)
            row.append(_cell(replay(trace, capacity, ranker)[0], base, bound))
        row += [f"{base_half * 100:.2f}%", f"{bound_half * 100:.2f}%"]
        print("| " + " | ".join(row) + " |", flush=True)


def _cell(rate: float, base: float, bound: float) -> str:
    share = (rate - base) / (bound - base) if bound > base else 0.0
    return f"{rate * 100:.2f}% ({share * 100:+.0f}%)"


if __name__ == "__main__":
    main()
