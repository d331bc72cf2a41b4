"""runtime.replay.run on the tiny checkpoint: modes, ordering, skipped turns, Ctrl-C, token traces, concurrency."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from radixcache.invariants import check_invariants
from radixcache.runtime.engine.engine import Engine
from radixcache.runtime.replay import (
    Comparison,
    ReplayConfig,
    ReplayError,
    compare,
    engine_factory,
    load_replay_trace,
    plan_sessions,
    replay,
    sample_trace_path,
)
from radixcache.stats import percentile
from radixcache.trace import Conversation, Turn
from radixcache.trace.records import TokenRequest
from radixcache.trace.replay_output import read_replay_json, replay_stats

SYSTEM = "You answer briefly."
CONVERSATIONS = [
    Conversation("a", (Turn("hello there", "RECORDED-A1"), Turn("and then?")), SYSTEM),
    Conversation("b", (Turn("good day", "RECORDED-B1"), Turn("what next?")), SYSTEM),
]


@pytest.fixture
def engine(tiny_model_dir: Path) -> Engine:
    return Engine(str(tiny_model_dir))


def test_the_sample_trace_ships_with_the_package_and_has_28_turns() -> None:
    trace = load_replay_trace()
    assert sample_trace_path().name == "sample_chat.jsonl"
    assert len(trace.records) == 8
    assert sum(len(c.turns) for c in trace.records) == 28
    assert len({c.system for c in trace.records}) == 2


def test_conversations_interleave_turn_by_turn_and_later_turns_hit_the_cache(engine: Engine) -> None:
    result = replay(engine, CONVERSATIONS, ReplayConfig(max_tokens=3))
    assert [(r.conversation, r.turn) for r in result.requests] == [("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    first, second = result.requests[0], result.requests[1]
    assert first.cached_tokens == 0
    assert second.cached_tokens > 0  # the shared system prompt
    for r in result.requests[2:]:  # the whole earlier turn (prompt + reply) minus the unaligned tail
        assert r.cached_tokens >= r.prompt_tokens - 2 * 16 - len("and then?") - 40
    s = result.summary
    assert s.requests == 4 and s.conversations == 2 and not s.interrupted
    assert s.hit_rate == pytest.approx(s.cached_tokens / s.prompt_tokens)
    assert s.prompt_tokens == s.cached_tokens + s.prefill_tokens
    assert s.ttft_p50_s <= s.ttft_p90_s <= s.ttft_p99_s
    check_invariants(engine.cache)
    assert engine.cache.locked_blocks == 0


def test_live_mode_feeds_the_models_reply_and_recorded_mode_the_traces(engine: Engine, monkeypatch) -> None:
    prompts: list[str] = []
    real = engine.generate

    def spy(prompt, *args, **kwargs):
        if kwargs.get("namespace") is None:
            prompts.append(engine.tokenizer.decode(list(prompt), skip_special_tokens=False))
        return real(prompt, *args, **kwargs)

    monkeypatch.setattr(engine, "generate", spy)
    live = replay(engine, CONVERSATIONS[:1], ReplayConfig(mode="live", max_tokens=3))
    assert live.requests[0].text in prompts[1] and "RECORDED-A1" not in prompts[1]
    prompts.clear()
    recorded = replay(engine, CONVERSATIONS[:1], ReplayConfig(mode="recorded", max_tokens=3))
    assert "RECORDED-A1" in prompts[1]
    assert recorded.summary.mode == "recorded"


def test_max_tokens_overrides_the_turns_own_limit(engine: Engine) -> None:
    convs = [Conversation("a", (Turn("hi", None, 5),))]
    assert replay(engine, convs, ReplayConfig()).requests[0].output_tokens <= 5
    assert replay(engine, convs, ReplayConfig(max_tokens=2)).requests[0].output_tokens <= 2


def test_a_turn_longer_than_the_context_is_skipped_with_the_rest_of_its_conversation(engine: Engine) -> None:
    convs = [
        Conversation("long", (Turn("x" * 5000), Turn("after"))),
        Conversation("ok", (Turn("fine"),)),
    ]
    warnings: list[str] = []
    result = replay(engine, convs, ReplayConfig(max_tokens=2), on_warning=warnings.append)
    assert [r.conversation for r in result.requests] == ["ok"]
    assert result.summary.skipped_too_long == 2
    skipped = [(s.conversation, s.turn, s.reason) for s in result.skipped]
    assert skipped == [("long", 1, "too_long"), ("long", 2, "too_long")]
    assert len(warnings) == 1 and "do not fit the model's context of 4,096" in warnings[0]


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_token_request_too_long_skips_only_itself_at_any_concurrency(engine: Engine, concurrency: int) -> None:
    """A token request carries its own history, so the rest of its session still runs. With --concurrency > 1 the
    session's task returned at the skipped request: its later requests neither ran nor counted as skipped."""
    requests = [
        TokenRequest(0.0, tuple(range(1, 40)), 2, session="u1"),
        TokenRequest(1.0, (5,) * 4100, 2, session="u1"),  # past the tiny model's context of 4,096
        TokenRequest(2.0, tuple(range(1, 50)), 2, session="u1"),
        TokenRequest(3.0, tuple(range(1, 30)), 2, session="u2"),
    ]
    result = replay(engine, requests, ReplayConfig(concurrency=concurrency, max_tokens=2))
    assert sorted((r.conversation, r.turn) for r in result.requests) == [("u1", 1), ("u1", 3), ("u2", 1)]
    assert [(s.conversation, s.turn, s.reason) for s in result.skipped] == [("u1", 2, "too_long")]


def test_a_turn_larger_than_the_kv_cache_is_skipped_and_counted(tiny_model_dir: Path) -> None:
    engine = Engine(str(tiny_model_dir), capacity_blocks=4, page_size=16)
    convs = [Conversation("big", (Turn("y" * 200),)), Conversation("small", (Turn("hi"),))]
    result = replay(engine, convs, ReplayConfig(max_tokens=2))
    assert result.summary.skipped_kv_full == 1
    assert [r.conversation for r in result.requests] == ["small"]
    check_invariants(engine.cache)


def test_ctrl_c_returns_what_finished_and_leaves_the_cache_consistent(engine: Engine, monkeypatch) -> None:
    real, calls = engine.generate, []

    def interrupted_third(prompt, *args, **kwargs):
        if kwargs.get("namespace") is None:
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
        return real(prompt, *args, **kwargs)

    monkeypatch.setattr(engine, "generate", interrupted_third)
    result = replay(engine, CONVERSATIONS, ReplayConfig(max_tokens=2))
    assert result.summary.interrupted
    assert result.summary.requests == 2
    assert engine.cache.locked_blocks == 0
    check_invariants(engine.cache)


def test_token_traces_go_to_the_engine_as_ids_grouped_by_session(engine: Engine) -> None:
    shared = tuple(range(1, 40))
    requests = [
        TokenRequest(0.0, (*shared, 50, 51), 3, session="s1"),
        TokenRequest(1.0, (*shared, 60), 2, session="s2"),
        TokenRequest(2.0, (*shared, 50, 51, 70, 71), 3, session="s1"),
    ]
    result = replay(engine, requests, ReplayConfig())
    assert [(r.conversation, r.turn) for r in result.requests] == [("s1", 1), ("s2", 1), ("s1", 2)]
    assert [r.prompt_tokens for r in result.requests] == [41, 40, 43]
    assert result.requests[1].cached_tokens == 32
    assert [r.output_tokens <= n for r, n in zip(result.requests, (3, 2, 3), strict=True)] == [True] * 3


def test_token_ids_outside_the_vocabulary_are_refused_before_running(engine: Engine) -> None:
    with pytest.raises(ReplayError, match="outside the model's vocabulary of 260"):
        replay(engine, [TokenRequest(0.0, (1, 2, 999), 2)], ReplayConfig())


def test_limit_keeps_the_first_conversations(engine: Engine) -> None:
    result = replay(engine, CONVERSATIONS, ReplayConfig(limit=1, max_tokens=2))
    assert {r.conversation for r in result.requests} == {"a"}


def test_concurrency_runs_conversations_side_by_side_in_turn_order(engine: Engine) -> None:
    """Through the scheduler's agenerate: each conversation's turns stay in order, and greedy replies are the
    same as one at a time."""
    alone = replay(engine, CONVERSATIONS, ReplayConfig(max_tokens=3))
    fresh = Engine(engine.model, tokenizer=engine.tokenizer)
    together = replay(fresh, CONVERSATIONS, ReplayConfig(concurrency=2, max_tokens=3))
    assert sorted((r.conversation, r.turn) for r in together.requests) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    for conv in ("a", "b"):
        assert [r.turn for r in together.requests if r.conversation == conv] == [1, 2]
    texts = lambda res: sorted((r.conversation, r.turn, r.text) for r in res.requests)  # noqa: E731
    assert texts(together) == texts(alone)
    assert together.summary.concurrency == 2


def test_concurrency_keeps_at_most_n_requests_in_flight(engine: Engine) -> None:
    class Counting:
        def __init__(self, inner: Engine) -> None:
            self.inner = inner
            self.in_flight = self.most = 0

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

        async def agenerate(self, prompt, max_new_tokens, **kwargs):
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            try:
                return await self.inner.agenerate(prompt, max_new_tokens, **kwargs)
            finally:
                self.in_flight -= 1

    convs = [Conversation(str(i), (Turn("hi"), Turn("more")), SYSTEM) for i in range(5)]
    wrapped = Counting(engine)
    result = replay(wrapped, convs, ReplayConfig(concurrency=3, max_tokens=2))
    assert wrapped.most == 3
    assert result.summary.requests == 10


def test_honor_timestamps_waits_for_each_requests_time(engine: Engine) -> None:
    requests = [TokenRequest(0.0, (1, 2, 3), 1), TokenRequest(300.0, (4, 5, 6), 1)]
    result = replay(engine, requests, ReplayConfig(honor_timestamps=True))
    assert result.requests[1].start_s >= 0.3
    warnings: list[str] = []
    replay(engine, CONVERSATIONS[:1], ReplayConfig(honor_timestamps=True, max_tokens=1), on_warning=warnings.append)
    assert any("no timestamps" in w for w in warnings)


def test_compare_runs_both_and_reports_ratios(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = compare(engine_factory(str(tiny_model_dir)), CONVERSATIONS, ReplayConfig(max_tokens=3))
    assert isinstance(result, Comparison)
    assert result.cached.summary.cache and not result.uncached.summary.cache
    assert result.uncached.summary.cached_tokens == 0
    assert result.text_mismatches == 0
    assert result.prefill_reduction > 1
    data = result.as_dict()
    assert set(data) >= {"summary", "requests", "no_cache", "comparison"}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data, indent=2))
    log = read_replay_json(path)
    assert log.no_cache is not None and replay_stats(log)["hit_rate"] == pytest.approx(result.cached.summary.hit_rate)


def test_conversations_that_share_an_id_stay_apart(tiny_model_dir: Path) -> None:
    """Two conversations with one id: their records had one name, so the summary counted one conversation and the
    comparison paired each with the other's reply ("1 requests differ" for identical text). Sampled, so the two
    replies differ; the runs give each the same seed, so each is the same with and without the cache."""
    convs = [Conversation("a", (Turn("Name a color."),)), Conversation("a", (Turn("What is two plus two?"),))]
    result = compare(engine_factory(str(tiny_model_dir)), convs, ReplayConfig(max_tokens=8, temperature=1.0))
    assert [r.conversation for r in result.cached.requests] == ["a", "a#2"]
    assert result.cached.requests[0].text != result.cached.requests[1].text
    assert result.text_mismatches == 0 and result.cached.summary.conversations == 2
    requests = [TokenRequest(0, (1, 2), 1, session="request-2"), TokenRequest(1, (3, 4), 1)]  # the 2nd's own name
    assert [s.id for s in plan_sessions(requests)] == ["request-2", "request-2#2"]


def test_percentile_interpolates_between_order_statistics() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0


@pytest.mark.parametrize("q", [150, -1, 100.5, float("nan"), float("inf"), True, "50", None])
def test_percentile_refuses_a_q_outside_0_to_100(q: object) -> None:
    """percentile(values, 150) raised IndexError (and -1 read from the end, NaN a ValueError from math.floor)."""
    for values in ([1.0, 2.0, 3.0], []):
        with pytest.raises(ValueError, match=r"percentile: q must be a number in \[0, 100\]"):
            percentile(values, q)  # type: ignore[arg-type]


def test_bad_config_values_are_refused() -> None:
    for kwargs in ({"mode": "dream"}, {"max_tokens": 0}, {"limit": 0}, {"temperature": -1.0}, {"concurrency": 0}):
        with pytest.raises(ReplayError):
            ReplayConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": 1.5},  # failed mid-run: "slice indices must be integers"
        {"seed": "3"},  # failed at the first sampled turn: "can only concatenate str"
        {"seed": 1.5},
        {"max_tokens": 2.5},
        {"concurrency": 2.5},  # ran, as if 2
        {"limit": True},  # ran, as limit 1
        {"default_max_tokens": 0.5},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"temperature": 500.0},  # the engine's bound is 100
        {"temperature": "0"},
        {"warmup": "no"},
        {"honor_timestamps": 1},
    ],
)
def test_config_values_of_the_wrong_type_are_refused_by_name(kwargs: dict) -> None:
    (name,) = kwargs
    with pytest.raises(ReplayError, match=f"^{name} must be"):
        ReplayConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"config": {"limit": 1}}, "config must be a ReplayConfig or None, got dict"),  # an AttributeError
        ({"trace": None}, "trace must be a Trace or a list"),  # a TypeError from list()
        ({"on_result": print, "on_warning": 3}, "on_warning must be a function or None, got int"),
        ({"on_result": "log"}, "on_result must be a function or None, got str"),  # a TypeError after a turn ran
        ({"label": 3}, "label must be a str or None, got int"),
    ],
)
def test_replay_arguments_of_the_wrong_type_are_refused_before_anything_runs(
    engine: Engine, kwargs: dict, named: str
) -> None:
    call = {"trace": CONVERSATIONS, "config": ReplayConfig(max_tokens=2), **kwargs}
    with pytest.raises(ReplayError, match=re.escape(named)):
        replay(engine, call.pop("trace"), call.pop("config"), **call)
    assert engine.stats.requests == 0  # not even the warm-up ran


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (TokenRequest(1.0, (1, 2), -1), "request-2 request 1: output_length must be an int >= 0, got -1"),
        (TokenRequest(1.0, (1, 2), True), "output_length must be an int >= 0, got True"),
        (TokenRequest(1.0, (1, 2), 1.5), "output_length must be an int >= 0, got 1.5"),
        (TokenRequest(1.0, (True, 2), 2), "token True is not a token id"),  # "a prompt must be text ..."
        (TokenRequest(1.0, (1, -2), 2), "token -2 is not a token id"),  # refused by the engine mid-run
        (TokenRequest(1.0, (1, 2), 2, retain_for=-3), "retain_for must be a number of seconds >= 0"),
        (TokenRequest(float("nan"), (1, 2), 2), "timestamp_ms must be a finite number, got nan"),
        (Conversation("b", (Turn("hi", max_tokens=0),)), "conversation b turn 1: max_tokens must be an int >= 1"),
        (Conversation("b", (Turn(3),)), "conversation b turn 1: user must be a str, got 3"),  # type: ignore[arg-type]
    ],
)
def test_records_built_in_python_are_checked_as_the_readers_check_them(engine: Engine, bad: object, named: str) -> None:
    """A TokenRequest or Turn built by hand is not read through the trace readers: output_length=-1 failed mid-run,
    after the requests before it, with "max_new_tokens must be an integer >= 1" naming no request."""
    first = TokenRequest(0.0, (1, 2, 3), 2) if isinstance(bad, TokenRequest) else CONVERSATIONS[0]
    with pytest.raises(ReplayError, match=re.escape(named)):
        replay(engine, [first, bad], ReplayConfig(warmup=False))  # type: ignore[list-item]
    assert engine.stats.requests == 0


def test_compare_refuses_arguments_of_the_wrong_type_before_building_an_engine() -> None:
    built: list[bool] = []
    for make, kw, named in [
        (None, {}, "make_engine must be a function"),
        (built.append, {"config": {"limit": 1}}, "config must be a ReplayConfig"),
        (built.append, {"on_start": "cache"}, "on_start must be a function or None, got str"),
    ]:
        with pytest.raises(ReplayError, match=named):
            compare(make, CONVERSATIONS, **kw)  # type: ignore[arg-type]
    assert built == []


def test_sampling_is_reproducible_per_request_position(tiny_model_dir: Path) -> None:
    config = ReplayConfig(temperature=1.0, seed=5, max_tokens=6)
    first = replay(Engine(str(tiny_model_dir)), CONVERSATIONS, config)
    second = replay(Engine(str(tiny_model_dir)), CONVERSATIONS, config)
    assert [r.text for r in first.requests] == [r.text for r in second.requests]


class _SessionSpy(Engine):
    """An engine that keeps each request's session; `routes_sessions` as ClusterEngine has it (True) or not."""

    def __init__(self, *args, routes_sessions: bool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.routes_sessions = routes_sessions
        self.sessions: list[object] = []

    def generate(self, *args, options=None, **kwargs):  # type: ignore[override]
        self.sessions.append(options.session if options is not None else kwargs.get("session"))
        return super().generate(*args, options=options, **kwargs)

    async def agenerate(self, *args, options=None, **kwargs):  # type: ignore[override]
        self.sessions.append(options.session if options is not None else kwargs.get("session"))
        return await super().agenerate(*args, options=options, **kwargs)


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_conversation_is_one_session_where_the_engine_routes_by_session(tiny_model_dir: Path, concurrency) -> None:
    """`replay --replicas` sent no session to the router (only a recording run did): a conversation's turns could
    land on replicas that did not hold its history. Where the engine routes by session, each turn carries its
    conversation's id; a plain engine is sent none."""
    config = ReplayConfig(max_tokens=2, warmup=False, concurrency=concurrency)
    with _SessionSpy(str(tiny_model_dir), routes_sessions=True) as engine:
        replay(engine, CONVERSATIONS, config)
        assert sorted(engine.sessions) == ["a", "a", "b", "b"]
    with _SessionSpy(str(tiny_model_dir), routes_sessions=False) as plain:
        replay(plain, CONVERSATIONS, config)
        assert plain.sessions == [None] * 4


def test_concurrency_runs_a_token_sessions_requests_in_arrival_order_as_one_at_a_time_does(tiny_model_dir) -> None:
    """A session whose requests the file lists out of time order (its later turn first) ran them in file order under
    --concurrency > 1 (and with --honor-timestamps, its first arrival only after the later one's time), where the
    sequential replay runs them by arrival: the same trace hit other pages. Both run them by arrival now."""
    base = [(7 * i + 3) % 250 for i in range(40)]
    requests = [
        TokenRequest(2000, tuple(base + [5] * 20), 2, session="a"),  # arrives second: it extends the first
        TokenRequest(0, tuple(base), 2, session="a"),
        TokenRequest(1000, (9, 9, 9), 2, session="b"),
    ]
    runs = {}
    for concurrency in (1, 2):
        result = replay(Engine(str(tiny_model_dir)), requests, ReplayConfig(concurrency=concurrency, max_tokens=2))
        runs[concurrency] = {(r.conversation, r.turn): r.cached_tokens for r in result.requests}
    assert runs[1] == {("a", 2): 0, ("b", 1): 0, ("a", 1): 32}  # the extension reads the first's two whole pages
    assert runs[2] == runs[1]
