"""`radixcache serve --cache-dir` across restarts, with the tiny checkpoint and the OpenAI client: a prompt served
before a SIGTERM is cached after the restart; after `kill -9` in the middle of heavy writing the server starts
again, no page on disk fails its checks, and the outputs equal the outputs of an engine without any cache.

What is tested is the disk tier's logic (write-behind, clean stop, crash safety, reload), not the model, so the tiny
random checkpoint serves (byte tokens: one token per character); its small pages are written fast, so the crash
test sends long prompts to keep the writer busy when the kill comes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from radixcache.runtime.kv.tier.disk_store import DiskStore

pytestmark = pytest.mark.slow  # four server starts
PAGE = 16
MAX_TOKENS = 6


def _client(server: Any) -> Any:
    import openai

    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=300)


def _long_prompt(topic: str, at_least: int = 600) -> str:
    """At least `at_least` tokens (the tiny checkpoint's tokenizer has one token per byte)."""
    text = f"Notes about {topic}. "
    n = 0
    while len(text.encode()) < at_least:
        text += f"Line {n}: {topic} has many facts worth writing down, and this is fact number {n}. "
        n += 1
    return text


def _complete(client: Any, prompt: str) -> Any:
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)


def test_a_prompt_served_before_sigterm_is_cached_after_the_restart(
    launch: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    cache_dir = str(tmp_path / "kv")
    prompt = _long_prompt("the river Seine")
    args = ("--cache-dir", cache_dir, "--page-size", str(PAGE), "--kv-memory", "96MiB")
    with launch(tiny_model_dir, *args) as server:
        first = _complete(_client(server), prompt)
        assert first.usage.prompt_tokens >= 600
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=120) == 0  # a clean stop: queued disk writes finish before it exits
    with launch(tiny_model_dir, *args) as server:
        again = _complete(_client(server), prompt)
        full_pages = (first.usage.prompt_tokens - 1) // PAGE * PAGE  # every full page before the last token
        assert again.usage.prompt_tokens_details.cached_tokens >= full_pages
        assert again.choices[0].text == first.choices[0].text
        text = httpx.get(server.url + "/metrics", timeout=10).text
        lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if "tier=" in line}
        disk_hits = lines['radixcache_tier_hit_tokens_total{model="tiny",tier="disk"}']
        assert disk_hits == again.usage.prompt_tokens_details.cached_tokens  # all of it came from the disk
        assert server.metrics()["radixcache_tier_disk_failed_reads_total"] == 0


def test_kill_9_during_heavy_writing_leaves_a_cache_that_is_safe_to_use(
    launch: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from radixcache.runtime import Engine

    cache_dir = tmp_path / "kv"
    topics = ["volcanoes", "glaciers", "deserts", "rainforests", "coral reefs", "tundra"]
    prompts = [_long_prompt(t, at_least=1000) for t in topics]  # about 370 pages to write; the kill comes at 20
    args = ("--cache-dir", str(cache_dir), "--page-size", str(PAGE), "--kv-memory", "96MiB")
    with launch(tiny_model_dir, *args) as server:
        client = _client(server)
        errors: list[BaseException] = []

        def send(prompt: str) -> None:
            try:
                _complete(client, prompt)
            except BaseException as exc:  # the kill cuts these off
                errors.append(exc)

        threads = [threading.Thread(target=send, args=(p,), daemon=True) for p in prompts]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 240
        while len(list(cache_dir.rglob("*.kvpage"))) < 20:  # pages are being written: kill now
            assert time.monotonic() < deadline, "no pages were written"
            time.sleep(0.01)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=30)
        for t in threads:
            t.join(timeout=30)
    written = len(list(cache_dir.rglob("*.kvpage")))
    assert written >= 20
    with DiskStore(cache_dir, max_bytes=1 << 34) as store:  # every page that reached its name is whole
        report = store.verify(delete=False)
    assert report.corrupt == () and report.ok == report.checked > 0

    with Engine(str(tiny_model_dir), enable_cache=False, kv_memory="96MiB", page_size=PAGE) as plain:
        want = [plain.generate(p, max_new_tokens=MAX_TOKENS).text for p in prompts]
    with launch(tiny_model_dir, *args) as server:
        client = _client(server)
        got = [_complete(client, p) for p in prompts]
        assert [g.choices[0].text for g in got] == want
        assert sum(g.usage.prompt_tokens_details.cached_tokens for g in got) > 0  # the pages that survived
        assert server.metrics()["radixcache_tier_disk_failed_reads_total"] == 0
