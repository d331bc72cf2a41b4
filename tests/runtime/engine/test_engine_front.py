"""The engine's typed front: EngineConfig (validated once), RequestOptions (one per request, every entry point),
the GenerationEngine protocol, and the request's KV state owned by the KV manager (kv/ imports nothing of engine/)."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime import Engine, EngineConfig, GenerationEngine, RequestOptions, SamplingParams
from radixcache.runtime.engine.scheduler_config import SchedulerConfig
from radixcache.runtime.kv.state import KVState, Status
from radixcache.runtime.testing import RandomModel

REPO = Path(__file__).resolve().parents[3]

# The keyword arguments Engine took before EngineConfig: they are its fields, one to one, in this order.
ENGINE_KEYWORDS = [
    "model",
    "kv_memory",
    "capacity_blocks",
    "page_size",
    "policy",
    "dtype",
    "device",
    "enable_cache",
    "prefill_chunk",
    "tokenizer",
    "schedule",
    "max_prefill_tokens",
    "mixed_prefill_tokens",
    "staged_prefill_attention",
    "max_running",
    "scheduler_config",
    "max_pinned_fraction",
    "quant",
    "gguf_activations",
    "threads",
    "mirror_memory",
    "max_queue",
    "queue_timeout",
    "host_kv_memory",
    "cache_dir",
    "cache_dir_size",
    "write_policy",
    "load_back",
    "prefetch_policy",
    "prefetch_timeout_ms",
    "prefetch_pages_per_step",
    "kv_events",
    "admission",
    "lease_fraction",
    "lease_clock",
    "thread_policy",  # added with the thread controller (runtime.engine.threads)
    "kernels",  # added with the kernels chosen by measurement (runtime.model.kernel_tune)
    "freeze_gc",  # added with the frozen heap (runtime.engine.gc_heap)
]


def test_engine_config_holds_exactly_the_engine_keywords() -> None:
    assert [f.name for f in dataclasses.fields(EngineConfig)] == ENGINE_KEYWORDS
    with pytest.raises(dataclasses.FrozenInstanceError):
        EngineConfig().page_size = 8  # type: ignore[misc]


def test_keywords_and_a_config_build_the_same_engine(tiny: RandomModel) -> None:
    by_keywords = Engine(tiny, capacity_blocks=32, page_size=4, schedule="fcfs")
    config = EngineConfig(model=tiny, capacity_blocks=32, page_size=4, schedule="fcfs")
    by_config = Engine(config=config)
    assert by_keywords.engine_config == config == by_config.engine_config
    assert Engine.from_config(config).scheduler.config == by_keywords.scheduler.config
    overridden = Engine(config=config, page_size=8)  # a keyword beside a config overrides its field
    assert overridden.cache.page_size == 8 and config.page_size == 4
    prompt = list(range(1, 20))
    assert by_keywords.generate(prompt, 4).token_ids == by_config.generate(prompt, 4).token_ids


def test_a_bad_option_fails_once_before_any_weights_load() -> None:
    with pytest.raises(TypeError, match=re.escape("Engine() got an unexpected keyword argument 'page_sise'")):
        Engine("no-such-model", page_sise=8)
    for bad, message in (
        ({"dtype": "int3"}, "dtype must be one of"),
        ({"write_policy": "sometimes"}, "write_policy must be one of"),
        ({"threads": 0}, "threads must be an int from 1 to 1024"),
        ({"threads": 2**31}, "threads must be an int from 1 to 1024"),  # hung the first request's caller
        ({"threads": 1025}, "threads must be an int from 1 to 1024"),
        ({"threads": 2.0}, "threads must be an int from 1 to 1024"),
        ({"thread_policy": "spin"}, "thread_policy must be one of adaptive, fixed"),
        ({"gguf_activations": "int4"}, "gguf_activations must be one of"),
        ({"thread_policy": ["fixed"]}, "thread_policy must be one of"),
        ({"max_pinned_fraction": 2.0}, "max_pinned_fraction must be a number in"),
        ({"max_pinned_fraction": "0.5"}, "max_pinned_fraction must be a number in"),  # a TypeError naming nothing
        ({"max_pinned_fraction": True}, "max_pinned_fraction must be a number in"),  # was the whole pool
        ({"enable_cache": "no"}, "enable_cache must be True or False"),  # was a cache, "no" being truthy
        ({"kv_events": "false"}, "kv_events must be True or False"),
        ({"freeze_gc": 0}, "freeze_gc must be True or False"),
        ({"mirror_memory": "lots"}, "mirror_memory: cannot parse memory budget"),  # named no option
        ({"mirror_memory": -1}, "mirror_memory: memory budget must be positive"),
        ({"queue_timeout": "3"}, "queue_timeout must be > 0 seconds"),  # a TypeError naming nothing
        ({"queue_timeout": True}, "queue_timeout must be > 0 seconds"),
        ({"max_queue": -1}, "max_queue must be an int >= 0"),
        ({"queue_timeout": 0}, "queue_timeout must be > 0"),
        ({"queue_timeout": "5"}, "queue_timeout must be > 0"),  # a TypeError that named no option
        ({"max_pinned_fraction": "0.5"}, "max_pinned_fraction must be a number in"),  # the same
        # every request then failed with AttributeError ('dict' object has no attribute ...), after the weights loaded
        ({"scheduler_config": {"schedule": "fcfs"}}, "scheduler_config must be a SchedulerConfig or None, got {"),
        ({"schedule": "random"}, "schedule must be one of"),
        ({"admission": "nope"}, "unknown admission policy"),
        ({"kv_memory": "lots"}, "cannot parse memory budget"),
        ({"cache_dir_size": "lots"}, "cache_dir_size: cannot parse memory budget"),  # was after the weights loaded
        ({"cache_dir_size": 0}, "cache_dir_size: memory budget must be positive"),
        ({"cache_dir": ""}, "cache_dir must be a non-empty text path"),  # was the current directory, made a cache
        ({"cache_dir": 123}, "cache_dir must be a non-empty text path"),
        ({"cache_dir": "/tmp/a\0b"}, "cache_dir must be a non-empty text path"),  # after the weights: no name
        # the tiers were ignored without a word: a disk tier asked for, none given
        ({"enable_cache": False, "cache_dir": "/tmp/x"}, "enable_cache=False keeps no pages, so cache_dir="),
        ({"enable_cache": False, "host_kv_memory": "1GiB"}, "enable_cache=False keeps no pages, so cache_dir="),
        ({"page_size": 0}, "page_size must be an int >= 1"),  # was a ZeroDivisionError once the weights loaded
        ({"page_size": -4}, "page_size must be an int >= 1"),
        ({"page_size": 2.0}, "page_size must be an int >= 1"),
        ({"capacity_blocks": 0}, "capacity_blocks must be an int >= 1"),
        ({"capacity_blocks": True}, "capacity_blocks must be an int >= 1"),
        # an AttributeError at every request, once the weights had loaded
        ({"scheduler_config": {"max_running": 4}}, "scheduler_config must be a SchedulerConfig or None, got {"),
        ({"tokenizer": 3}, "tokenizer must have encode and decode methods"),  # an AttributeError at each request
    ):
        with pytest.raises(ValueError, match=message):
            Engine("no-such-model", **bad)  # the model is never looked for: the config is refused first
        with pytest.raises(ValueError, match=message):
            EngineConfig(**bad)
    with pytest.raises(ValueError, match="model must be a name, a path or a loaded model"):  # 'int' has no .config
        Engine(3)
    for config in ({"page_size": 4}, "smollm2"):  # an AttributeError ('dict' object has no attribute 'replace')
        with pytest.raises(ValueError, match="config must be an EngineConfig"):
            Engine("no-such-model", config=config)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="config must be an EngineConfig"):
            Engine(config=config)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"max_wait_s": "10"}, "max_wait_s must be a number of seconds >= 0"),
        ({"max_wait_s": float("nan")}, "max_wait_s must be a number of seconds >= 0"),  # the guard never fired
        ({"max_wait_s": -1.0}, "max_wait_s must be a number of seconds >= 0"),
        ({"max_wait_steps": None}, "max_wait_steps must be an int >= 0"),
        ({"max_wait_steps": 2.5}, "max_wait_steps must be an int >= 0"),
        ({"share_in_flight": "no"}, "share_in_flight must be True or False"),
        ({"in_batch_sharing": 0}, "in_batch_sharing must be True or False"),
    ],
)
def test_a_scheduler_config_whose_starvation_guard_is_no_number_is_refused(
    tiny: RandomModel, bad: dict, message: str
) -> None:
    """The starvation guard is read at every admission: max_wait_s="10" (or max_wait_steps=None) was accepted, then
    every request the engine ran failed with a TypeError from that compare, naming no option."""
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**bad)
    fine = SchedulerConfig(max_wait_steps=0, max_wait_s=float("inf"))  # the guard at once by steps, never by time
    engine = Engine(tiny, capacity_blocks=64, page_size=4, scheduler_config=fine)
    alone = Engine(tiny, capacity_blocks=64, page_size=4)
    prompts = [[5, 6, 7, 8, 9], [5, 6, 7, 10]]
    assert [r.token_ids for r in engine.generate(prompts, 3)] == [r.token_ids for r in alone.generate(prompts, 3)]


def test_request_options_take_generate_keywords_once() -> None:
    opts = RequestOptions.of(8, temperature=0.5, stop="x", seed=3, namespace="ns", priority=2, retain="conversation")
    assert opts.max_new_tokens == 8 and opts.sampling.stop == ("x",) and opts.priority == 2
    assert opts.updated(seed=4).sampling.seed == 4 and opts.sampling.seed == 3  # frozen: a new object
    params = SamplingParams(max_new_tokens=3)
    assert RequestOptions.of(params=params).sampling is params  # a whole SamplingParams, max_new_tokens included
    with pytest.raises(ValueError, match=r"max_new_tokens, temperature given beside params="):
        RequestOptions.of(99, params=params, temperature=1.0)  # both were dropped without a word
    with pytest.raises(TypeError, match=re.escape("Engine.generate() got an unexpected keyword argument 'temprature'")):
        RequestOptions.of(8, temprature=0.5)
    with pytest.raises(ValueError, match="namespace must be hashable"):
        RequestOptions.of(8, namespace=["a"])
    with pytest.raises(ValueError, match="timeout must be > 0"):
        RequestOptions.of(8, timeout=0)
    with pytest.raises(ValueError, match="top_p must be in"):
        opts.updated(top_p=0.0)


def test_every_entry_point_takes_options_or_their_keywords(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    prompt = list(range(3, 30))
    opts = RequestOptions.of(5, ignore_eos=True, temperature=0.8, seed=11)
    by_keywords = engine.generate(prompt, 5, ignore_eos=True, temperature=0.8, seed=11)
    assert engine.generate(prompt, options=opts).token_ids == by_keywords.token_ids
    assert engine.submit(prompt, options=opts).result().token_ids == by_keywords.token_ids
    assert (
        engine.generate(prompt, options=opts, seed=12).token_ids
        == engine.generate(prompt, options=opts.updated(seed=12)).token_ids
    )
    with pytest.raises(TypeError, match=re.escape("Engine.submit() got an unexpected keyword argument 'colour'")):
        engine.submit(prompt, 4, colour="red")
    # each entry point names itself, not the one it calls (generate's and agenerate's said Engine.submit())
    with pytest.raises(TypeError, match=re.escape("Engine.generate() got an unexpected keyword argument 'colour'")):
        engine.generate(prompt, 4, colour="red")
    with pytest.raises(TypeError, match=re.escape("Engine.generate() got an unexpected keyword argument 'colour'")):
        engine.generate(prompt, options=opts, colour="red")
    with pytest.raises(TypeError, match=re.escape("Engine.agenerate() got an unexpected keyword argument 'colour'")):
        asyncio.run(engine.agenerate(prompt, 4, colour="red"))
    for each, message in (([1, 2], "each[0] must be a dict"), (5, "each must be a list"), ({"seed": 1}, "a list")):
        with pytest.raises(ValueError, match=re.escape(message)):  # [1, 2] was a TypeError from inside `updated`
            engine.submit_group([prompt, prompt], 4, each=each)
    session = engine.session(max_new_tokens=3, ignore_eos=True)
    assert session.options.max_new_tokens == 3 and len(session.send("hi").token_ids) == 3


def test_a_session_and_its_turns_take_options_as_every_entry_point_does(tiny: RandomModel, tmp_path) -> None:
    """docs/api.md: every entry point, sessions included, takes `options=` a RequestOptions built once; a session
    and each of its turns refused it with TypeError ("unexpected keyword argument 'options'")."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    opts = RequestOptions.of(4, ignore_eos=True, temperature=0.8, seed=11)
    by_keywords = engine.session(max_new_tokens=4, ignore_eos=True, temperature=0.8, seed=11).send("hi")
    assert engine.session(options=opts).send("hi").token_ids == by_keywords.token_ids
    assert engine.session().send("hi", options=opts).token_ids == by_keywords.token_ids
    shorter = engine.session(options=opts, max_new_tokens=2)  # keywords beside it override its fields
    assert shorter.send("hi").token_ids == by_keywords.token_ids[:2]
    assert len(shorter.send("more", options=opts, max_new_tokens=3).token_ids) == 3
    with pytest.raises(ValueError, match="session default options="):  # JSON cannot hold it: refused, not dropped
        shorter.save(tmp_path / "s.json")


def test_max_new_tokens_beside_options_overrides_them_as_any_keyword_does(tiny: RandomModel) -> None:
    """`generate(p, options=opts, max_new_tokens=3)` ran opts' 8 tokens: the argument could not be told from its
    default, so every entry point but a session turn dropped it without a word."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    opts = RequestOptions.of(8, ignore_eos=True)
    chat = [{"role": "user", "content": "hi"}]

    async def streamed() -> str:
        return "".join([d async for d in engine.stream("hello", max_new_tokens=3, options=opts)])

    assert len(engine.generate("hello", options=opts).token_ids) == 8  # the options' own when none is given
    assert len(engine.generate("hello", ignore_eos=True).token_ids) == 64  # and 64 without options
    assert len(engine.generate("hello", options=opts, max_new_tokens=3).token_ids) == 3
    assert len(engine.generate("hello", 3, options=opts).token_ids) == 3
    assert len(engine.submit("hello", options=opts, max_new_tokens=3).result().token_ids) == 3
    assert len(engine.chat(chat, max_new_tokens=3, options=opts).token_ids) == 3
    assert len(asyncio.run(engine.agenerate("hello", max_new_tokens=3, options=opts)).token_ids) == 3
    assert len(asyncio.run(engine.achat(chat, max_new_tokens=3, options=opts)).token_ids) == 3
    assert [len(r.token_ids) for r in engine.fork("hello", 2, max_new_tokens=3, options=opts)] == [3, 3]
    assert [len(h.result().token_ids) for h in engine.submit_group(["a", "b"], 3, options=opts)] == [3, 3]
    assert asyncio.run(streamed()) == engine.generate("hello", 3, options=opts).text


def test_fork_offsets_the_seed_of_its_options_as_it_does_its_seed_keyword(tiny: RandomModel) -> None:
    """A seed given in `options=` went to every branch unchanged: the n samples of one fork were the same text,
    where the same options as keywords gave branch i the seed `seed + i`."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    opts = RequestOptions.of(8, temperature=1.0, seed=0, ignore_eos=True)
    by_keywords = [r.token_ids for r in engine.fork("hello there", 3, 8, temperature=1.0, seed=0, ignore_eos=True)]
    assert len(set(by_keywords)) == 3
    assert [r.token_ids for r in engine.fork("hello there", 3, options=opts)] == by_keywords
    history = [{"role": "system", "content": "be brief."}]
    branches = [r.token_ids for r in engine.session(system="be brief.", options=opts).fork(3)]
    assert branches == [r.token_ids for r in engine.fork(history, 3, 8, temperature=1.0, seed=0, ignore_eos=True)]
    assert len(set(branches)) == 3
    # A turn's own options replace the session's, its seed too (the session's default seed was passed over them)
    seeded = engine.session(system="be brief.", seed=3, temperature=1.0, max_new_tokens=8, ignore_eos=True)
    other = RequestOptions.of(8, temperature=1.0, seed=100, ignore_eos=True)
    assert [r.token_ids for r in seeded.fork(2, options=other)] == [
        r.token_ids for r in engine.fork(history, 2, options=other)
    ]
    by_default = [r.token_ids for r in seeded.fork(2)]
    assert by_default == [r.token_ids for r in engine.fork(history, 2, 8, temperature=1.0, seed=3, ignore_eos=True)]


def test_a_user_turn_without_content_stays_in_the_session_history(tiny: RandomModel) -> None:
    """`send(None)` (an agent passing a message's missing content) generated from a prompt with that user turn, but
    the history kept only the reply: every later turn was another conversation than the one the model answered."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    s = engine.session(system="be brief.", max_new_tokens=3, ignore_eos=True)
    first = s.send(None)  # type: ignore[arg-type]
    sent = [{"role": "system", "content": "be brief."}, {"role": "user", "content": None}]
    assert first.token_ids == engine.chat(sent, 3, ignore_eos=True).token_ids
    assert s.messages == [*sent, {"role": "assistant", "content": first.text}]
    history = [*s.messages, {"role": "user", "content": "and?"}]
    assert s.send("and?").token_ids == engine.chat(history, 3, ignore_eos=True).token_ids


def test_engine_satisfies_the_generation_engine_protocol(tiny: RandomModel) -> None:
    assert isinstance(Engine(tiny, capacity_blocks=16), GenerationEngine)
    from radixcache.runtime.cluster.front import ClusterEngine

    methods = [name for name, value in vars(GenerationEngine).items() if callable(value) and not name.startswith("_")]
    assert "submit" in methods and all(callable(getattr(ClusterEngine, name, None)) for name in methods)


def test_a_request_holds_its_kv_state_and_the_kv_package_never_imports_the_engine(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    req = engine._request(list(range(1, 12)), 4, namespace="t", pin=8)
    assert isinstance(req.kv, KVState) and req.kv.status is Status.WAITING
    assert (req.kv.rid, req.kv.namespace, req.kv.prompt_tokens, req.kv.max_new_tokens, req.kv.pin) == (
        req.rid,
        "t",
        11,
        4,
        8,
    )
    engine.run(req)
    assert req.kv.status is Status.FINISHED and not req.kv.block_table and req.kv.match_node is None
    bad = []
    for path in sorted((REPO / "runtime" / "kv").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("radixcache.runtime.engine"):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno} imports {node.module}")
    assert not bad, "kv/ must not import engine/ (type-checking imports included):\n" + "\n".join(bad)


def test_options_that_are_no_request_options_are_refused_by_name(tiny: RandomModel) -> None:
    """options={"max_new_tokens": 2} (keywords in a dict) was an AttributeError ('dict' object has no attribute
    'updated') at every entry point and at session creation."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    bad: Any = {"max_new_tokens": 2}
    for call in (
        lambda: engine.generate("hi", options=bad),
        lambda: engine.submit("hi", options=bad),
        lambda: engine.submit_group(["hi"], options=bad),
        lambda: engine.fork("hi", 2, options=bad),
        lambda: engine.session(options=bad),
        lambda: engine.session().send("hi", options=bad),
        lambda: asyncio.run(engine.agenerate("hi", options=bad)),
    ):
        with pytest.raises(
            ValueError, match=r"options must be a RequestOptions \(RequestOptions.of\(...\)\), got dict"
        ):
            call()
    assert engine.stats.requests == 0
    assert engine.generate("hi", options=RequestOptions.of(2, ignore_eos=True)).finish_reason == "length"
    engine.close()
