"""`trace stats`: its reuse figures are what an infinite cache hits (radixcache.trace.stats)."""

from __future__ import annotations

import json
from pathlib import Path

from radixcache.sim.evaluation import evaluate
from radixcache.trace import read_trace
from radixcache.trace.stats import trace_stats
from radixcache.trace.workload import load_workload


def test_a_prompts_partial_last_page_never_counts_as_a_hit(tmp_path: Path) -> None:
    """The second request repeats the first's prompt and output: its prompt's partial page (9, 10) plus its own
    output (11, 12) equals the first request's third page. A cache matches the prompt alone, so it hits the two whole
    pages, 8 of 18 prompt tokens; stats counted the third page too (10 of 18)."""
    lines = [
        {"timestamp": 0, "tokens": list(range(1, 9)), "output_length": 4, "output_tokens": [9, 10, 11, 12]},
        {"timestamp": 1, "tokens": list(range(1, 11)), "output_length": 2, "output_tokens": [11, 12]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    stats = trace_stats(read_trace(path), page_size=4)
    assert (stats.reused_refs, stats.block_refs, stats.requests_with_hit) == (2, 5, 1)
    assert stats.infinite_hit_rate == 8 / 18
    report = evaluate(load_workload(path, page_size=4), 100, "lru", infinite=True)
    assert report.as_dict()["infinite_hit_rate"] == stats.infinite_hit_rate
