"""The engine with a host tier and a disk tier: greedy outputs equal outputs without any cache while pages are
demoted, loaded back and restored from disk, with requests arriving while others run; a restarted engine hits what
the last one served; corrupted page files are detected and recomputed; and a cache directory is never shared across
weights (and a model built in code's norm epsilon), weight format, KV dtype, page size or namespace."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.load_costs import LoadCosts
from radixcache.runtime.model import block_linear
from radixcache.runtime.model.block_linear import BlockLinear
from radixcache.runtime.testing import (
    CharTokenizer,
    RandomModel,
    random_block_weight,
    random_weights,
    tiny_config,
    tiny_model,
)
from radixcache.tier.tiered_cache import WRITE_POLICIES

MAX_NEW = 6
# float64: requests arriving in waves are batched differently from run to run, and in float32 a different batch can
# flip a near-tie of the tiny random model's logits; tiers copy pages bit for bit, so in float64 any mismatch is a bug.
DTYPE = "float64"


def _prompts(vocab: int, seed: int = 0, n: int = 10) -> list[list[int]]:
    """Conversations over two shared system prompts, each turn extending an earlier prompt (prefixes repeat)."""
    rng = random.Random(seed)
    systems = [[rng.randrange(vocab) for _ in range(24)] for _ in range(2)]
    prompts: list[list[int]] = []
    for i in range(n):
        base = prompts[rng.randrange(len(prompts))] if prompts and rng.random() < 0.5 else systems[i % 2]
        prompts.append(base + [rng.randrange(vocab) for _ in range(rng.randrange(3, 14))])
    return prompts


def _baseline(model: RandomModel, prompts: list[list[int]]) -> list[list[int]]:
    engine = Engine(model, capacity_blocks=400, page_size=4, enable_cache=False, dtype=DTYPE)
    with engine:
        return [r.token_ids for r in engine.generate(prompts, max_new_tokens=MAX_NEW)]


def _run_staggered(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    """Submit in waves while earlier requests still prefill or decode; return outputs in prompt order."""
    handles = []
    for i in range(0, len(prompts), 3):
        handles += engine.submit(prompts[i : i + 3], max_new_tokens=MAX_NEW)
        time.sleep(0.002)
    return [h.result(timeout=120).token_ids for h in handles]


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=5)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def _host_bytes(model: RandomModel, pages: int, page_size: int) -> int:
    return pages * page_size * model.config.kv_bytes_per_token(4)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("policy", WRITE_POLICIES)
def test_tiered_outputs_equal_uncached_outputs_through_demotion_load_and_restart(
    model: RandomModel, tmp_path: Path, page_size: int, policy: str
) -> None:
    prompts = _prompts(model.config.vocab_size)
    want = _baseline(model, prompts)
    small = 160 // page_size  # the device pool holds a few prompts: pages are demoted and loaded back all along
    # load_back="always": the measured comparison may decline loads of a tiny model's cheap pages (it is tested below)
    kwargs = {"page_size": page_size, "write_policy": policy, "cache_dir": tmp_path, "load_back": "always"}
    kwargs["dtype"] = DTYPE
    with Engine(model, capacity_blocks=small, host_kv_memory=_host_bytes(model, 400, 1), **kwargs) as engine:
        assert _run_staggered(engine, prompts) == want
        assert _run_staggered(engine, prompts[::-1]) == want[::-1]
        engine.check()
        assert engine.stats.tiers.host_saved_pages > 0
        assert engine.flush(30)
    # Whether the staggered waves above read a demoted page back depends on how the machine's load batches them
    # (one CI run under load loaded none). One request at a time, forwards then backwards, on a fresh engine whose
    # device holds about two prompts and whose writes land before the next request, the order is fixed: the backward
    # pass reads prompts the forward pass demoted.
    fresh = {**kwargs, "cache_dir": tmp_path / "sequential"}
    with Engine(model, capacity_blocks=small // 2, host_kv_memory=_host_bytes(model, 400, 1), **fresh) as engine:
        order = [*range(len(prompts)), *reversed(range(len(prompts)))]
        got = []
        for i in order:
            got.append(engine.generate(prompts[i], max_new_tokens=MAX_NEW).token_ids)
            # A loaded CI machine's disk writer lags (one run had 25 writes still queued): a page only queued is not
            # on disk yet, so the backward pass would recompute it. Waiting for the writes fixes what disk holds.
            assert engine.flush(30)
        assert got == [want[i] for i in order]
        engine.check()
        tiers = engine.stats.tiers
        if policy == "write_through_selective":  # only pages hit twice reach the host: others come from disk
            assert tiers.host_loaded_pages + tiers.disk_loaded_pages > 0
        else:
            assert tiers.host_loaded_pages > 0 and tiers.host_hit_tokens > 0  # pages came back from the host
    with Engine(model, capacity_blocks=small, **kwargs) as restarted:  # no host tier: disk only
        assert _run_staggered(restarted, prompts) == want
        restarted.check()
        assert restarted.stats.tiers.disk_loaded_pages > 0 and restarted.stats.tiers.disk_failed_reads == 0


def test_a_restarted_engine_hits_every_full_page_it_served(model: RandomModel, tmp_path: Path) -> None:
    prompt = _prompts(model.config.vocab_size, seed=3, n=1)[0] * 3
    with Engine(model, capacity_blocks=200, page_size=4, cache_dir=tmp_path) as first:
        want = first.generate(prompt, max_new_tokens=MAX_NEW)
    with Engine(model, capacity_blocks=200, page_size=4, cache_dir=tmp_path) as second:
        got = second.generate(prompt, max_new_tokens=MAX_NEW)
    assert got.token_ids == want.token_ids
    assert len(prompt) % 4 == 0  # the last token's page is a full page the first engine wrote
    assert got.cached_tokens == len(prompt) - 1  # every position but the last: its page came off the disk too
    assert second.stats.tiers.disk_hit_tokens == got.cached_tokens


def test_a_shared_prefix_hit_on_the_device_outlives_colder_pages_on_a_full_disk(model: RandomModel, tmp_path) -> None:
    """The disk's LRU saw only its own writes and reads: a system prompt every request hit on the device was written
    once, first, so a disk at its size limit deleted exactly those pages, and a restart found nothing it could load
    (its run starts at the first page) although the disk held 30 pages of other replies."""
    rng = random.Random(7)
    system = [rng.randrange(1, model.config.vocab_size) for _ in range(24)]  # 6 pages of 4
    prompts = [system + [rng.randrange(1, model.config.vocab_size) for _ in range(10)] for _ in range(12)]
    kwargs = {"capacity_blocks": 400, "page_size": 4, "dtype": DTYPE, "cache_dir": tmp_path}
    with Engine(model, **kwargs) as probe:  # one page file's size, for a limit of 30 pages
        probe.generate(prompts[0], 1)
        assert probe.flush(30)
    page_bytes = max(p.stat().st_size for p in tmp_path.rglob("*.kvpage"))
    shutil.rmtree(tmp_path)
    with Engine(model, **kwargs, cache_dir_size=30 * page_bytes) as first:
        for p in prompts:  # each writes ~4 pages of its own: about 50 in all, over the limit
            first.generate(p, MAX_NEW, ignore_eos=True)
            assert first.flush(30)
        assert first.stats.tiers.device_hit_tokens >= 11 * len(system)
    want = _baseline(model, [prompts[0]])[0]
    with Engine(model, **kwargs, cache_dir_size=30 * page_bytes) as restarted:
        got = restarted.generate(prompts[0], MAX_NEW)
    assert got.token_ids == want
    assert got.cached_tokens >= len(system)  # the shared prefix came off the disk


def test_a_resumed_request_counts_what_it_computes_again_with_a_disk_tier(model: RandomModel, tmp_path: Path) -> None:
    """The disk refresh on a device hit was placed between the first admission's branch and its `else`, taking it:
    with a disk tier a resumed request that matched device pages counted no recomputation (0 over 5 preemptions)."""
    shared = list(range(1, 41))
    prompts = [[*shared, 50 + i, 60 + i, 70 + i] for i in range(6)]  # 43 tokens: a resumption's last page is partial
    with Engine(model, capacity_blocks=40, page_size=4, dtype=DTYPE, cache_dir=tmp_path) as engine:
        engine.generate(shared, 1, ignore_eos=True)
        got = engine.generate(prompts, 40, ignore_eos=True)
        s = engine.stats
    with Engine(model, capacity_blocks=400, page_size=4, enable_cache=False, dtype=DTYPE) as alone:
        assert [g.token_ids for g in got] == [r.token_ids for r in alone.generate(prompts, 40, ignore_eos=True)]
    assert s.preemptions > 0 and s.recomputed_tokens > 0
    assert s.recomputed_tokens == sum(g.recomputed_tokens for g in got)


def test_corrupted_page_files_are_deleted_and_recomputed(model: RandomModel, tmp_path: Path) -> None:
    prompts = _prompts(model.config.vocab_size, seed=4, n=6)
    want = _baseline(model, prompts)
    with Engine(model, capacity_blocks=200, page_size=4, cache_dir=tmp_path, load_back="always", dtype=DTYPE) as engine:
        engine.generate(prompts, max_new_tokens=MAX_NEW)
    files = sorted(tmp_path.rglob("*.kvpage"))
    assert len(files) > 10
    flipped = files[::3]
    for i, path in enumerate(flipped):  # one byte flipped: in the header, the tokens or the payload
        data = bytearray(path.read_bytes())
        data[(len(data) * (i % 5 + 1)) // 6] ^= 0x40
        path.write_bytes(bytes(data))
    with Engine(model, capacity_blocks=200, page_size=4, cache_dir=tmp_path, load_back="always", dtype=DTYPE) as engine:
        assert _run_staggered(engine, prompts) == want
        assert engine.stats.tiers.disk_failed_reads > 0
    # A flipped page the run did not need to read (its prefix was on the device by then) is still on disk, and
    # still caught: verify removes it. Then nothing fails any more.
    with DiskStore(tmp_path, max_bytes=1 << 30) as store:
        report = store.verify(delete=True)
    assert report.ok == report.checked - len(report.corrupt)
    assert set(map(Path, report.corrupt)) <= set(flipped)
    with Engine(model, capacity_blocks=200, page_size=4, cache_dir=tmp_path, load_back="always", dtype=DTYPE) as engine:
        assert _run_staggered(engine, prompts) == want
        assert engine.stats.tiers.disk_failed_reads == 0 and engine.stats.tiers.disk_hit_tokens > 0


@pytest.mark.parametrize(
    "change",
    [
        {"page_size": 2},
        {"dtype": "float64"},
        {"quant": "fp16"},
        {"model_seed": 6},
        {"namespace": "another-tenant"},
        {"rms_norm_eps": 30.0},  # the same tensors in code: the norms before every K/V projection differ
    ],
    ids=["page-size", "kv-dtype", "weight-format", "weights", "namespace", "norm-eps"],
)
def test_a_cache_dir_is_never_shared_across_what_makes_kv_bytes_differ(
    model: RandomModel, tmp_path: Path, change: dict
) -> None:
    prompt = _prompts(model.config.vocab_size, seed=8, n=1)[0]
    with Engine(model, capacity_blocks=100, page_size=4, cache_dir=tmp_path) as first:
        first.generate(prompt, max_new_tokens=2)
    assert first.stats.tiers.disk_queued_pages > 0
    other = model
    if "model_seed" in change:
        m = tiny_model(seed=change["model_seed"])
        other = RandomModel(m.config, m.weights, model.tokenizer)
    if "rms_norm_eps" in change:
        other = RandomModel(
            dataclasses.replace(model.config, rms_norm_eps=change["rms_norm_eps"]), model.weights, model.tokenizer
        )
    kwargs = {"page_size": change.get("page_size", 4), "dtype": change.get("dtype", "float32")}
    kwargs["quant"] = change.get("quant", "none")
    namespace = change.get("namespace")
    with Engine(other, capacity_blocks=100, cache_dir=tmp_path, **kwargs) as second:
        result = second.generate(prompt, max_new_tokens=2, namespace=namespace)
        assert result.cached_tokens == 0
        assert second.stats.tiers.disk_hit_tokens == 0
    # and the unchanged engine still hits (the pages are there)
    with Engine(model, capacity_blocks=100, page_size=4, cache_dir=tmp_path) as again:
        assert again.generate(prompt, max_new_tokens=2).cached_tokens > 0


def _gguf_disk_hits(cache_dir: Path, mode: str) -> int:
    """An engine on a tiny Q4_1 model in activations `mode` serves one prompt from `cache_dir`: its disk hits."""
    cfg = tiny_config(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=16)
    weights, blocks = random_weights(cfg, 5), {}
    for i, (name, w) in enumerate(sorted(weights.items())):
        if w.dim() == 2 and name != "model.embed_tokens.weight":
            blocks[name] = random_block_weight("Q4_1", *w.shape, seed=5 + i)
            weights[name] = blocks[name].dequantize()
    source = SimpleNamespace(config=cfg, weights=weights, blocks=blocks, tokenizer=CharTokenizer(cfg.vocab_size))
    prompt = _prompts(cfg.vocab_size, seed=8, n=1)[0]
    kw = {"quant": "gguf", "gguf_activations": mode, "capacity_blocks": 100, "page_size": 4}
    with Engine(source, cache_dir=cache_dir, load_back="always", **kw) as engine:
        engine.generate(prompt, max_new_tokens=8, ignore_eos=True)
        assert engine.flush(30)
        return engine.stats.tiers.disk_hit_tokens


needs_cc = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="GGUF kernels need a C compiler")


@needs_cc
def test_gguf_engines_of_other_activation_modes_share_no_pages(tmp_path: Path) -> None:
    """int8 activations round what a pass computes (logits 0.04 apart from float's where float noise is 1e-5): an
    engine of another mode must not load those pages as if it had computed them."""
    assert _gguf_disk_hits(tmp_path, "int8") == 0
    assert _gguf_disk_hits(tmp_path, "float") == 0  # were int8's pages, loaded
    assert _gguf_disk_hits(tmp_path, "int8") > 0  # they are there for their own mode


@needs_cc
def test_gguf_auto_engines_that_chose_other_kernels_share_no_pages(tmp_path: Path, monkeypatch) -> None:
    """ "auto" times the kernels in each process: a restart that chose float must not load the pages of a process
    that chose int8 (both record the mode "auto")."""
    monkeypatch.setattr(block_linear, "_CHOICES", {})  # the choices of this process, made per test below

    def disk_hits(kernel: str) -> int:
        block_linear._CHOICES.clear()  # a new process: it times the kernels again, and this time picks `kernel`
        monkeypatch.setattr(BlockLinear, "_measure", lambda self: kernel)
        return _gguf_disk_hits(tmp_path, "auto")

    assert disk_hits("int8") == 0
    assert disk_hits("float") == 0  # were int8's pages, loaded
    assert disk_hits("int8") > 0  # they are there for processes that choose alike


def test_an_unusable_cache_dir_disables_the_tier_without_failing_requests(model: RandomModel, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with Engine(model, capacity_blocks=100, page_size=4, cache_dir=blocker / "cache") as engine:
        prompt = _prompts(model.config.vocab_size, seed=9, n=1)[0]
        want = engine.generate(prompt, max_new_tokens=2).token_ids
        assert engine.generate(prompt, max_new_tokens=2).token_ids == want
        assert not engine.tiers.disk.enabled
        assert engine.stats.tiers.disk_queued_pages == 0
        assert engine.stats.tiers.disk_dropped_pages == (len(prompt) + 1) // 4  # every page adopted, not written


def test_a_read_only_cache_dir_disables_writes_without_failing_requests(model: RandomModel, tmp_path: Path) -> None:
    import os

    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    tmp_path.chmod(0o500)
    try:
        with Engine(model, capacity_blocks=100, page_size=4, cache_dir=tmp_path / "sub") as engine:
            prompt = _prompts(model.config.vocab_size, seed=9, n=1)[0]
            assert engine.generate(prompt, max_new_tokens=2).token_ids
    finally:
        tmp_path.chmod(0o700)


def test_load_back_never_fills_the_tiers_but_serves_nothing_from_them(model: RandomModel, tmp_path: Path) -> None:
    prompts = _prompts(model.config.vocab_size, seed=11, n=4)
    with Engine(model, capacity_blocks=200, page_size=4, cache_dir=tmp_path) as first:
        first.generate(prompts, max_new_tokens=2)
    with Engine(model, capacity_blocks=200, page_size=4, cache_dir=tmp_path, load_back="never") as second:
        second.generate(prompts, max_new_tokens=2)
        assert second.stats.tiers.disk_loaded_pages == 0 and second.stats.tiers.declined_pages > 0
    with pytest.raises(ValueError, match="load_back"):
        Engine(model, capacity_blocks=200, page_size=4, cache_dir=tmp_path, load_back="sometimes")


def test_loads_are_declined_when_recomputing_is_measured_cheaper(model: RandomModel, tmp_path: Path) -> None:
    prompts = _prompts(model.config.vocab_size, seed=10, n=6)
    want = _baseline(model, prompts)
    with Engine(model, capacity_blocks=200, page_size=4, cache_dir=tmp_path, dtype=DTYPE) as first:
        first.generate(prompts, max_new_tokens=MAX_NEW)
    with Engine(model, capacity_blocks=200, page_size=4, cache_dir=tmp_path, dtype=DTYPE) as second:
        costs = second.tiers.costs
        costs.note_prefill(1000, 1e-6)  # prefill measured at a nanosecond per token: loading a page never pays
        for _ in range(costs.MIN_SAMPLES):  # fewer measured loads never decline a tier
            costs.note_load("disk", 1, 1.0)
        assert len(prompts) < costs.PROBE_FIRST  # no probe in this run
        assert [r.token_ids for r in second.generate(prompts, max_new_tokens=MAX_NEW)] == want
        tiers = second.stats.tiers
        assert tiers.disk_loaded_pages == 0 and tiers.declined_pages > 0


def _restart_after_slow_reads(
    model: RandomModel, tmp_path: Path, n: int, slow_reads: int, pages: int = 1, burst: int = 0
):
    """`n` distinct prompts served by one engine, then by a second on the same cache directory, whose disk loads were
    measured `slow_reads` times at a second a page: its first `burst` prompts submitted at once, the rest one at a
    time (so that their decisions come in order). Recomputing
    a page is pinned at 40 ms (the tiny model's measured prefill would make the comparison depend on the machine's
    speed), so a real read of its pages is far cheaper. Returns the second engine's results, its tier counters and
    its LoadCosts, after checking the outputs against an engine without a cache."""
    rng = random.Random(12)
    prompts = [[rng.randrange(model.config.vocab_size) for _ in range(rng.randrange(21, 30))] for _ in range(n)]
    want = _baseline(model, prompts)
    with Engine(model, capacity_blocks=200, page_size=4, cache_dir=tmp_path, dtype=DTYPE) as first:
        first.generate(prompts, max_new_tokens=MAX_NEW)
    with Engine(model, capacity_blocks=200, page_size=4, cache_dir=tmp_path, dtype=DTYPE) as second:
        costs = second.tiers.costs
        costs.prefill_s_per_token = 0.01
        costs.note_prefill = lambda tokens, seconds: None
        for _ in range(slow_reads):
            costs.note_load("disk", pages, float(pages))
        handles = second.submit(prompts[:burst], max_new_tokens=MAX_NEW) if burst else []
        got = [h.result(timeout=120) for h in handles]
        got += [second.generate(p, max_new_tokens=MAX_NEW) for p in prompts[burst:]]
        assert [r.token_ids for r in got] == want
        return got, second.stats.tiers, costs


def test_one_slow_first_load_does_not_switch_the_disk_tier_off(model: RandomModel, tmp_path: Path) -> None:
    """A restarted replay once served nothing from disk: its warm-up's first disk read, on a busy machine, was
    measured dearer than recomputing, and no page was loaded again, so never measured again."""
    got, tiers, _ = _restart_after_slow_reads(model, tmp_path, 4, slow_reads=1, pages=2)
    # The next loads are measured (real reads, far under 40 ms a page): the median of three ignores the first.
    assert all(r.cached_tokens > 0 for r in got) and tiers.declined_pages == 0


def test_a_declined_disk_tier_is_probed_and_comes_back_once_it_measures_cheaper(
    model: RandomModel, tmp_path: Path
) -> None:
    got, tiers, costs = _restart_after_slow_reads(model, tmp_path, 12, slow_reads=LoadCosts.MIN_SAMPLES)
    # PROBE_FIRST declines, then the probe, whose real read (well under a millisecond a page) replaces the stale
    # second: every later request loads again.
    served = [r.cached_tokens > 0 for r in got]
    assert served == [False] * costs.PROBE_FIRST + [True] * (len(got) - costs.PROBE_FIRST)
    assert tiers.declined_pages > 0 and tiers.disk_loaded_pages > 0


def test_a_probe_in_a_burst_of_requests_brings_the_disk_tier_back(model: RandomModel, tmp_path: Path) -> None:
    """Twelve requests arrive at once at an engine whose disk tier was measured dearer: they are admitted over one
    or more passes, each deciding as it is admitted; the ninth decision probes (its pages read while it waits), and
    the requests after the burst find the tier open again."""
    got, tiers, costs = _restart_after_slow_reads(model, tmp_path, 16, slow_reads=LoadCosts.MIN_SAMPLES, burst=12)
    served = [r.cached_tokens > 0 for r in got]
    assert not any(served[: costs.PROBE_FIRST]) and any(served[costs.PROBE_FIRST : 12])
    assert all(served[12:]) and tiers.declined_pages > 0


def test_flush_and_close_refuse_a_timeout_that_is_no_number_of_seconds(model, tmp_path: Path) -> None:
    """Engine.flush(nan) waited for ever on a queued write, flush(inf) raised OverflowError from the clock; close
    passed them on to the disk writer after cancelling everything. Refused before anything is done."""
    engine = Engine(model, capacity_blocks=40, page_size=4, cache_dir=tmp_path)
    engine.generate(list(range(1, 30)), max_new_tokens=2)
    for bad in (float("nan"), -1.0, "5"):
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0 or None"):
            engine.flush(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0 or None"):
            engine.close(bad)  # type: ignore[arg-type]
        for wait in (engine.check, engine.wait_idle):  # check(nan) was a bare TimeoutError, wait_idle("5") a TypeError
            with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0 or None"):
                wait(bad)  # type: ignore[arg-type]
    assert engine.generate(list(range(1, 9)), max_new_tokens=2, ignore_eos=True).finish_reason == "length"
    assert engine.flush(float("inf")) and engine.close(float("inf"))
    assert engine.tiers.disk.stats().writes > 0
