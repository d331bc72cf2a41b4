"""A replay's requests over time: the hit rate per window of arrival time (`Timeline`, cut into `Window`s)."""

from __future__ import annotations

from array import array

from radixcache.errors import RadixCacheError
from radixcache.sim.results import Window

#: the most hit-rate windows a replay keeps: far more than any table or plot shows. Each is a row of counters made
#: up front, so simulate(..., windows=10**9) ran the machine out of memory before its first request.
MAX_WINDOWS = 100_000
#: below this many tokens a call's float64 sums of ints are exact (`Timeline.add_many`)
_EXACT_SUMS = 2**53


class Timeline:
    """Each request's arrival time, prompt tokens and hit tokens, cut into `count` windows of equal length from the
    first arrival to the last. With the trace's `span` (first and last timestamp) known up front, requests go
    straight into their window (constant memory); without it they are kept in flat arrays (24 bytes a request)
    and cut once the trace has gone by. Both give the same windows."""

    def __init__(self, count: int = 20, span: tuple[float, float] | None = None) -> None:
        if type(count) is not int or not 1 <= count <= MAX_WINDOWS:
            raise RadixCacheError(f"windows must be an int in [1, {MAX_WINDOWS:,}], got {count!r}")
        self.count, self.span = count, span
        self.times = array("d")
        self.prompts = array("q")
        self.hits = array("q")
        self.bins = [[0, 0, 0] for _ in range(count)]  # requests, prompt tokens, hit tokens
        self.requests = self.prompt_tokens = self.hit_tokens = 0
        if span is not None:
            t0, t1 = span
            self.t0, self.width = t0, ((t1 - t0) / count if t1 > t0 else 1.0)

    def add(self, timestamp_ms: float, prompt_tokens: int, hit_tokens: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.hit_tokens += hit_tokens
        if self.span is None:
            self.times.append(timestamp_ms)
            self.prompts.append(prompt_tokens)
            self.hits.append(hit_tokens)
            return
        row = self.bins[min(max(int((timestamp_ms - self.t0) / self.width), 0), self.count - 1)]
        row[0] += 1
        row[1] += prompt_tokens
        row[2] += hit_tokens

    def add_many(self, timestamps_ms: list[float], prompt_tokens: list[int], hit_tokens: list[int]) -> None:
        """`add` for each request in turn (a hit past its prompt counts as the prompt), with the same windows and
        the same counts: summed in float64 only while that is exact (the flat replays' windows were a few tokens off
        the tree's for a trace of requests of 2**62 tokens)."""
        hits = [hit if hit < tokens else tokens for hit, tokens in zip(hit_tokens, prompt_tokens, strict=True)]
        total = sum(prompt_tokens)
        if total >= _EXACT_SUMS:  # float64 sums of ints would round (a hash trace's block of 2**62 tokens): one by one
            for request in zip(timestamps_ms, prompt_tokens, hits, strict=True):
                self.add(*request)
            return
        self.requests += len(hits)
        self.prompt_tokens += total
        self.hit_tokens += sum(hits)
        if self.span is None:
            self.times.extend(timestamps_ms)
            self.prompts.extend(prompt_tokens)
            self.hits.extend(hits)
            return
        import numpy as np  # imported here: only the flat replays, which use numpy anyway, add in bulk

        # `add`'s window, computed the same way: the float quotient truncated toward zero, then clamped.
        at = ((np.array(timestamps_ms, dtype=np.float64) - self.t0) / self.width).astype(np.int64)
        at = np.clip(at, 0, self.count - 1)
        counts = np.bincount(at, minlength=self.count).tolist()
        prompts = np.bincount(at, np.array(prompt_tokens, dtype=np.int64), self.count)
        hit_sums = np.bincount(at, np.array(hits, dtype=np.int64), self.count)
        for row, n, tokens, hit in zip(self.bins, counts, prompts.tolist(), hit_sums.tolist(), strict=True):
            row[0] += n
            row[1] += round(tokens)  # float64 sums of ints: exact, the call's tokens being below 2**53
            row[2] += round(hit)

    def windows(self) -> tuple[Window, ...]:
        count = self.count
        if self.span is None:
            times = self.times
            self.t0 = times[0] if times else 0.0
            span = (times[-1] - self.t0) if times else 0.0
            self.width = span / count if span > 0 else 1.0
            for t, n, h in zip(times, self.prompts, self.hits, strict=True):
                row = self.bins[min(int((t - self.t0) / self.width), count - 1)]
                row[0] += 1
                row[1] += n
                row[2] += h
        t0, width = self.t0, self.width
        return tuple(Window(t0 + i * width, t0 + (i + 1) * width, *self.bins[i]) for i in range(count))
