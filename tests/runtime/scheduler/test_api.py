"""The Python API over the scheduler: batches, asyncio, streaming, threads, sessions, metrics."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.options import MAX_GROUP
from radixcache.runtime.engine.session import Session
from radixcache.runtime.testing import RandomModel, hold_engine_loop

from .conftest import assert_clean, ids


def test_generate_and_chat_take_lists_and_keep_single_signatures(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    one = engine.generate("hello there", 5, ignore_eos=True)
    many = engine.generate(["hello there", "general kenobi"], 5, ignore_eos=True)
    assert isinstance(many, list) and many[0].token_ids == one.token_ids
    convs = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]]
    chats = engine.chat(convs, 4, ignore_eos=True)
    assert [c.token_ids for c in chats] == [engine.chat(c, 4, ignore_eos=True).token_ids for c in convs]
    r = many[1]
    assert r.queue_s >= 0 and r.ttft_s >= r.queue_s and r.latency_s >= r.ttft_s
    assert r.tpot_s > 0 and r.preemptions == 0 and r.recomputed_tokens == 0
    assert_clean(engine)


def test_agenerate_runs_requests_concurrently_in_one_event_loop(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=256, page_size=4)
    prompts = [ids(8 + i, 70 + i) for i in range(6)]
    want = [engine.generate(p, 8, ignore_eos=True).token_ids for p in prompts]

    async def main() -> list:
        return await asyncio.gather(*(engine.agenerate(p, 8, ignore_eos=True) for p in prompts))

    steps = engine.stats.steps
    got = asyncio.run(main())
    assert [g.token_ids for g in got] == want
    assert engine.stats.steps - steps < 6 * 8, "the six requests shared decode steps"
    assert_clean(engine)


def test_stream_yields_deltas_that_add_up_to_the_text(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    full = engine.generate("stream me", 12, ignore_eos=True)
    stopped = engine.generate("stream me", 12, ignore_eos=True, stop=full.text[5:7])

    async def collect(**kw: object) -> list[str]:
        return [d async for d in engine.stream("stream me", 12, ignore_eos=True, **kw)]

    deltas = asyncio.run(collect())
    assert "".join(deltas) == full.text and len(deltas) > 3
    assert "".join(asyncio.run(collect(stop=full.text[5:7]))) == stopped.text
    msgs = [{"role": "user", "content": "hi"}]

    async def chat() -> str:
        return "".join([d async for d in engine.stream(msgs, 6, ignore_eos=True)])

    assert asyncio.run(chat()) == engine.chat(msgs, 6, ignore_eos=True).text
    assert_clean(engine)


def test_a_stream_shows_nothing_that_a_longer_stop_string_may_still_cut(tiny: RandomModel) -> None:
    """While the text was shorter than the stop string's holdback, the slice `text[: len(text) - holdback]` took a
    negative end and showed all but the last characters: with a 6-character stop string starting at the second
    character, the stream showed two characters of which the result keeps one."""
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    full = engine.generate("stream me", 12, ignore_eos=True).text
    stop = full[1:7]
    assert full.find(stop) == 1
    want = engine.generate("stream me", 12, ignore_eos=True, stop=stop)
    assert want.text == full[:1]

    async def collect() -> list[str]:
        return [d async for d in engine.stream("stream me", 12, ignore_eos=True, stop=stop)]

    assert "".join(asyncio.run(collect())) == want.text
    assert_clean(engine)


def metaspace_model(tiny: RandomModel) -> RandomModel:
    """The tiny model with a SentencePiece-style tokenizer (Llama 2, Mistral): words are "▁word" tokens, and decoding
    drops the space of the first token of what it decodes."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    from radixcache.runtime.loading.tokenizer import Tokenizer

    vocab = {"<unk>": 0, "</s>": 1} | {f"\u2581w{i}": i for i in range(2, tiny.config.vocab_size)}
    backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    return RandomModel(tiny.config, tiny.weights, Tokenizer(backend, eos_token_ids=[1]))


def test_a_stream_adds_up_to_the_result_text_with_a_sentencepiece_tokenizer(tiny: RandomModel) -> None:
    """The stream and the result both read the output after the prompt's last tokens (the first "▁w" token keeps
    its space, which a SentencePiece decoder drops at the start of what it decodes): the stream once decoded after
    the prompt and the result without it, and the stream's last tokens were never shown."""
    model = metaspace_model(tiny)
    engine = Engine(model, capacity_blocks=128, page_size=4)
    prompt = "w5 w6 w7 w8 w9 w10"

    async def collect(n: int) -> str:
        return "".join([d async for d in engine.stream(prompt, n, ignore_eos=True)])

    for n in (1, 2, 9):
        result = engine.generate(prompt, n, ignore_eos=True)
        tok, prompt_ids = model.tokenizer, model.tokenizer.encode(prompt)
        assert result.text == tok.decode(prompt_ids + list(result.token_ids))[len(tok.decode(prompt_ids)) :]
        assert asyncio.run(collect(n)) == result.text, n
    assert_clean(engine)


def test_leaving_a_stream_early_cancels_the_request(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=256, page_size=4)

    async def first_two() -> None:
        n = 0
        async for _ in engine.stream("go on and on", 400, ignore_eos=True):
            n += 1
            if n == 2:
                break

    asyncio.run(first_two())
    engine.generate("x", 1)  # a request after the cancel: the loop has applied it
    assert_clean(engine)


def test_callers_on_many_threads_get_their_own_answers(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=256, page_size=4)
    prompts = [ids(6 + i, 80 + i) for i in range(8)]
    want = [Engine(tiny, capacity_blocks=64, page_size=4).generate(p, 10, ignore_eos=True).token_ids for p in prompts]
    got: dict[int, tuple[int, ...]] = {}

    def worker(i: int) -> None:
        got[i] = engine.generate(prompts[i], 10, ignore_eos=True).token_ids

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [got[i] for i in range(8)] == want
    assert_clean(engine)


def test_session_appends_replies_hits_the_cache_and_round_trips_json(tiny: RandomModel, tmp_path) -> None:
    engine = Engine(tiny, capacity_blocks=256, page_size=4)
    s = engine.session(system="be brief.", max_new_tokens=6, ignore_eos=True)
    a = s.send("hello")
    b = s.send("and then?")
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert s.messages[2]["content"] == a.text
    assert b.cached_tokens >= 16, "the second turn reuses the first"
    path = tmp_path / "s.json"
    s.save(path)
    t = Session.load(engine, path)
    assert t.messages == s.messages and t.defaults == s.defaults
    c1, c2 = s.send("more"), t.send("more")
    assert c1.token_ids == c2.token_ids and c2.cached_tokens > 0
    assert asyncio.run(t.asend("async")).finish_reason == "length"
    assert len(s.fork(3, temperature=1.0, seed=1)) == 3 and len(s.messages) == 7
    with pytest.raises(ValueError, match="system"):
        Session(engine, system="x", messages=s.messages)
    assert_clean(engine)


def test_engine_metrics_report_queues_hits_and_blocks(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    handles = [engine.submit(ids(12, 90 + i), 200, ignore_eos=True) for i in range(3)]
    while engine.stats.running + engine.stats.waiting < 3 and not handles[0].done():
        pass
    s = engine.stats
    assert s.running + s.waiting <= 3
    for h in handles:
        h.cancel()
    [h.result() for h in handles]
    s = engine.stats
    assert s.running == s.waiting == 0
    assert s.free_blocks + s.evictable_blocks + s.locked_blocks == s.capacity_blocks
    assert s.requests == 3 and s.steps > 0


def test_wait_idle_returns_once_cancelled_requests_are_dropped_and_the_loop_thread_is_gone(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    handles = [engine.submit(ids(24, seed), 200, ignore_eos=True) for seed in range(3)]
    for handle in handles:
        handle.cancel()
    assert engine.wait_idle(timeout=60)
    assert engine.stats.running == engine.stats.waiting == 0
    assert all(h.result(timeout=5).finish_reason == "cancelled" for h in handles)
    assert_clean(engine)
    assert engine.wait_idle(timeout=0)  # already idle: returns at once


def test_cancelling_an_awaiting_task_aborts_its_request_and_spares_the_others(tiny: RandomModel) -> None:
    # Cancelling the task cancels the future it awaits; the engine loop must then drop that request's result
    # instead of failing on the cancelled future (which once killed the loop thread and every other request).
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    # The loop is held until the cancel: a fresh-clone CI run on a quiet machine finished the 100 tokens within the
    # 0.05 s the test used to wait, so the task ended before its cancel and nothing was cancelled.
    release = hold_engine_loop(engine)

    async def main() -> None:
        doomed = asyncio.create_task(engine.agenerate(ids(24, 1), 100, ignore_eos=True))
        survivor = asyncio.create_task(engine.agenerate(ids(20, 2), 40, ignore_eos=True))
        await asyncio.sleep(0.05)  # both tasks have submitted their requests and await them
        doomed.cancel()
        release()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        result = await survivor
        assert len(result.token_ids) == 40

    asyncio.run(main())
    assert engine.wait_idle(timeout=60)
    assert_clean(engine)


def test_submit_group_takes_any_iterable_of_prompts_and_refuses_none_by_name(tiny: RandomModel) -> None:
    """A generator of prompts (which submit takes) and None were TypeErrors from len(); the generator now runs as the
    same list would, and None is the ValueError saying what a prompt is."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    prompts = [ids(8, 1), ids(8, 2)]
    want = [h.result().token_ids for h in engine.submit_group(prompts, 3)]
    assert [h.result().token_ids for h in engine.submit_group(iter(prompts), 3)] == want
    assert [h.result().token_ids for h in engine.submit_group((p for p in prompts), 3)] == want
    assert engine.submit_group(iter([]), 3) == []
    for bad in (None, 5):
        with pytest.raises(ValueError, match="a prompt must be text, token ids or a list of prompts"):
            engine.submit_group(bad, 3)  # type: ignore[arg-type]
    assert_clean(engine)


@pytest.mark.parametrize(("bad", "shown"), [(False, "bool False"), (None, "NoneType None"), (2.0, "float 2.0")])
def test_a_bad_token_in_token_ids_is_named_by_its_position(tiny: RandomModel, bad: object, shown: str) -> None:
    """[5, 6, False, 7] was read as a batch of four prompts, and the error named the first: "got int 5"."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    for call in (engine.generate, engine.submit):
        with pytest.raises(ValueError, match=re.escape(f"prompt[2] must be a token id (an integer), got {shown}")):
            call([5, 6, bad, 7], 3)
    assert_clean(engine)


@pytest.mark.parametrize("one", ["abc", [5, 6, 7]], ids=["text", "ids"])
def test_submit_group_refuses_one_prompt_in_place_of_a_list(tiny: RandomModel, one: object) -> None:
    """A text given as the group ran each of its characters as a prompt of its own."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    with pytest.raises(ValueError, match=r"list of prompts.*\[prompt\]"):
        engine.submit_group(one, 3)  # type: ignore[arg-type]
    assert engine.submit_group([], 3) == []
    assert_clean(engine)


@pytest.mark.parametrize("n", [2.5, "3", True, 0, -1])
def test_fork_refuses_an_n_that_is_not_a_positive_integer_by_name(tiny: RandomModel, n: object) -> None:
    """n=2.5 failed inside list arithmetic ("can't multiply sequence"), n="3" in a comparison, n=True ran one branch,
    and an empty session's fork(0) said its prompt was empty: n is checked first, by name."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    with pytest.raises(ValueError, match=r"fork needs n >= 1"):
        engine.fork(ids(8, 1), n, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"fork needs n >= 1"):
        engine.session().fork(n)  # type: ignore[arg-type]
    assert_clean(engine)


def test_fork_and_submit_group_refuse_more_than_max_group_requests(tiny: RandomModel) -> None:
    """fork("hi", 10**6) queued a million requests (the server caps n at 16): one call's group is bounded, a
    ValueError naming the call, before anything is queued (one past the bound: the test stays quick when it fails)."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    for call in (
        lambda: engine.fork(ids(8, 1), MAX_GROUP + 1, 3),
        lambda: engine.fork(ids(8, 1), None, 3, continuations=[ids(2, 2)] * (MAX_GROUP + 1)),
        lambda: engine.session().fork(MAX_GROUP + 1),
    ):
        with pytest.raises(ValueError, match=f"fork queues at most {MAX_GROUP} requests together"):
            call()
    with pytest.raises(ValueError, match=f"submit_group queues at most {MAX_GROUP} requests together, got 1025"):
        engine.submit_group([ids(8, 1)] * (MAX_GROUP + 1), 3)
    assert engine.stats.requests == 0 and engine.queue.waiting == 0
    assert len(engine.fork(ids(8, 1), 2, 2)) == 2
    assert_clean(engine)


def test_fork_refuses_a_seed_whose_last_branch_passes_the_largest_seed(tiny: RandomModel) -> None:
    """fork(seed=2**64 - 1, n=2) said "seed must be an integer in [...], got 18446744073709551616": the second
    branch's seed, which the caller never gave. The largest seed is itself a valid fork of one branch."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    top = 2**64 - 1
    with pytest.raises(ValueError, match=f"fork: seed {top} \\+ 1 \\(one per branch\\) passes the largest seed {top}"):
        engine.fork(ids(8, 1), 2, 2, seed=top, temperature=1.0)
    assert engine.stats.requests == 0
    assert len(engine.fork(ids(8, 1), 1, 2, seed=top, temperature=1.0)) == 1
    assert len(engine.fork(ids(8, 1), 2, 2, seed=top - 1, temperature=1.0)) == 2
    assert_clean(engine)


def test_fork_refuses_an_n_that_disagrees_with_its_continuations(tiny: RandomModel) -> None:
    """fork(prefix, 3, continuations=[a, b]) ran two branches and dropped n: the caller meant something else."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    with pytest.raises(ValueError, match=r"fork got n=3 and 2 continuations"):
        engine.fork(ids(8, 1), 3, 2, continuations=[ids(2, 2), ids(2, 3)])
    assert len(engine.fork(ids(8, 1), 2, 2, continuations=[ids(2, 2), ids(2, 3)])) == 2
    assert len(engine.fork(ids(8, 1), max_new_tokens=2)) == 4  # n's default
    assert_clean(engine)


@pytest.mark.parametrize(("kw", "named"), [({"continuations": "ab"}, "continuations"), ({"seed": "x"}, "seed")])
def test_fork_refuses_a_text_for_continuations_and_a_seed_that_is_not_an_integer(
    tiny: RandomModel, kw: dict, named: str
) -> None:
    """continuations="ab" ran one branch per character ("a", then "b"), and seed="x" failed on `seed + i` with
    "can only concatenate str": both are now refused by name, before any branch is queued."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    with pytest.raises(ValueError, match=named):
        engine.fork(ids(8, 1), 2, 3, **kw)
    with pytest.raises(ValueError, match=named):
        engine.session().fork(2, **kw)
    assert engine.stats.requests == 0
    assert_clean(engine)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ([], "session data must be an object"),
        ({"messages": "hi"}, "session messages must be a list"),
        ({"messages": [{"role": "user", "content": "hi"}, 7]}, r"session messages\[1\] must be a message object"),
        ({"defaults": "max_new_tokens=3"}, "session defaults must be an object"),
    ],
)
def test_a_malformed_session_file_is_a_clear_error(tiny: RandomModel, tmp_path, data: object, named: str) -> None:
    """A hand-edited or damaged session file failed with AttributeError ('list' object has no attribute 'get'),
    TypeError ('int' object is not iterable) or "dictionary update sequence element #0 has length 1"."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    path = tmp_path / "session.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=named):
        Session.load(engine, path)
    assert Session.from_dict(engine, {"messages": None}).messages == []


def test_saving_a_session_with_a_default_json_cannot_hold_keeps_the_earlier_file(tiny: RandomModel, tmp_path) -> None:
    """save() opened the file, then json.dump raised TypeError half way on a GrammarSpec default: the earlier save
    at that path was left truncated ('{"messages": [...], "defaults": {"grammar": '), unreadable."""
    from radixcache.runtime.grammar import GrammarSpec

    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    path = tmp_path / "session.json"
    engine.session(system="be brief.", max_new_tokens=3).save(path)
    before = path.read_text(encoding="utf-8")
    s = engine.session(system="be brief.", max_new_tokens=3, grammar=GrammarSpec.regex("[a-z]+"))
    with pytest.raises(ValueError, match=r"session default grammar=.* cannot be saved as JSON"):
        s.save(path)
    assert path.read_text(encoding="utf-8") == before
    assert Session.load(engine, path).defaults == {"max_new_tokens": 3}


def test_stats_read_while_the_loop_thread_pins(tiny: RandomModel) -> None:
    """`engine.stats` is read on other threads (the server's /metrics) while the loop thread pins and unpins: its
    walk of the pin table raised RuntimeError("dictionary changed size during iteration") when a pin landed
    meanwhile. Here one lands in the middle of the walk; the walk counts the pins it began with."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4, max_pinned_fraction=1.0)
    a, b = ids(16, 1), ids(16, 2)
    for p in (a, b):
        engine.generate(p, 1)
    assert engine.wait_idle(30)
    pins = engine.kv.pins
    assert pins.pin(a, None) == 16
    key, node = next(iter(pins._pins.items()))

    class PinnedMeanwhile:  # a's node, whose first read happens while the loop thread pins b
        def __getattr__(self, name: str) -> object:
            if len(pins) == 1:
                pins.pin(b, None)
            return getattr(node, name)

    pins._pins[key] = PinnedMeanwhile()  # type: ignore[assignment]
    try:
        assert engine.stats.pinned_blocks == 4
    finally:
        pins._pins[key] = node
    assert engine.stats.pinned_blocks == 8
    assert engine.unpin() == 2
    assert_clean(engine)


@pytest.mark.parametrize("timeout", [float("nan"), -1, "5", True])
def test_a_handle_result_timeout_that_is_no_number_of_seconds_is_refused(tiny: RandomModel, timeout: object) -> None:
    """handle.result(nan) raised a bare TimeoutError at once, result("5") a TypeError from inside the wait, and
    result(True) waited one second: the bound is checked as check(), close() and flush() check theirs."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    release = hold_engine_loop(engine)
    handle = engine.submit(ids(8, 1), 2)
    try:
        with pytest.raises(ValueError, match=r"timeout must be a number of seconds >= 0 or None"):
            handle.result(timeout)  # type: ignore[arg-type]
    finally:
        release()
    assert len(handle.result(float("inf")).token_ids) == 2  # infinity: no bound
    assert_clean(engine)
