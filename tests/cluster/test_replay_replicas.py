"""`replay` over replicas (runtime.cluster.front.ClusterEngine): the warm-up reaches every replica, past the router (one
routed warm-up warmed one replica, and each other replica's first measured request carried its start-up costs), and
leaves nothing a measured request hits. Two real replica engines, run in this process by the in-process Ray stand-in."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from radixcache.trace.records import TokenRequest
from tests.cluster.inproc_front import inproc_front

ENGINE = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64"}


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with inproc_front(monkeypatch, 3, "cache_aware", ENGINE) as engine:
        yield engine


def test_the_warm_up_reaches_every_replica_and_the_router_counts_only_measured_requests(front: Any) -> None:
    from radixcache.runtime.replay import ReplayConfig, replay

    trace = [TokenRequest(timestamp_ms=0, tokens=tuple(range(1, 14)), output_length=2, session="s")]
    result = replay(front, trace, ReplayConfig(max_tokens=2))
    assert [r.stats.requests for r in front.replicas].count(1) == 2  # the warm-up alone on two replicas
    assert sorted(r.stats.requests for r in front.replicas) == [1, 1, 2]  # and with the measured request on one
    assert sum(front.cluster.stats().routed.values()) == 1  # the router saw the measured request only
    front.cluster.poll()  # the warm-up's pages reach the index: in their own namespace, they match no prompt
    assert len(result.requests) == 1 and result.requests[0].cached_tokens == 0
    again = replay(front, trace, ReplayConfig(max_tokens=2, warmup=False))
    assert again.requests[0].cached_tokens == 12  # the measured prompt's own 3 whole pages, on its replica


def test_replay_on_replicas_refuses_a_bad_trace_before_starting_them(
    tmp_path: Any, tiny_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token id outside the model's vocabulary was refused only once Ray and every replica were up (15 s on the
    tiny model); it is refused against the model's config and tokenizer before any replica starts."""
    from click.testing import CliRunner

    from radixcache.cli import replay as replay_cli
    from radixcache.cli.main import main

    started: list[object] = []
    monkeypatch.setattr(replay_cli, "cluster_engine", lambda *args: started.append(args) or pytest.fail("started"))
    trace = tmp_path / "ag.jsonl"
    runner = CliRunner()
    made = runner.invoke(main, ["trace", "gen", "agent-sessions", str(trace), "--count", "4"])
    assert made.exit_code == 0, made.output
    done = runner.invoke(main, ["replay", str(trace), "--model", str(tiny_dir), "--replicas", "2"])
    assert done.exit_code != 0 and started == []
    assert "outside the model's vocabulary of 260" in done.output


def test_replay_on_replicas_lets_max_tokens_run_an_output_length_of_0(
    tmp_path: Any, tiny_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The early check takes --max-tokens as the replay's own does: an output_length of 0 runs with that limit (the
    check refused it there, telling the user to give the --max-tokens they had given)."""
    import json

    from click.testing import CliRunner

    from radixcache.cli import replay as replay_cli
    from radixcache.cli.main import main

    started: list[object] = []

    def start(*args: object) -> None:
        started.append(args)
        raise RuntimeError("the replicas would start here")

    monkeypatch.setattr(replay_cli, "cluster_engine", start)
    trace = tmp_path / "zero.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "tokens": [5, 6, 7], "output_length": 0, "session": "s"}) + "\n")
    runner = CliRunner()
    refused = runner.invoke(main, ["replay", str(trace), "--model", str(tiny_dir), "--replicas", "2"])
    assert refused.exit_code != 0 and "output_length is 0" in refused.output and started == []
    ran = runner.invoke(main, ["replay", str(trace), "--model", str(tiny_dir), "--replicas", "2", "--max-tokens", "2"])
    assert len(started) == 1, ran.output  # past the check, on to start the replicas


def test_a_request_whose_thread_does_not_start_is_not_left_in_flight(
    front: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request whose thread could not start ("can't start new thread") stayed counted as in flight: wait_idle and
    close waited out their whole timeout for a request nothing would ever end."""
    import threading
    import types

    from radixcache.runtime.cluster import front as front_module

    class NoThread(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patch:
        patch.setattr(front_module, "threading", types.SimpleNamespace(Thread=NoThread, Condition=threading.Condition))
        with pytest.raises(RuntimeError, match="can't start new thread"):
            front.submit([1, 2, 3], 2)
    assert front.wait_idle(0)  # nothing is in flight
    assert front.generate([1, 2, 3], 2).finish_reason == "length"  # and the front door still serves
    assert front.close(30)


def test_the_per_replica_table_counts_the_measured_requests_only(front: Any) -> None:
    """The per-replica rows came from each replica's engine stats, warm-up included: a replica that served no measured
    request showed its 8 warm-up prompt tokens and 2 indexed pages. They count from the stats taken after the warm-up,
    as the single engine's table counts its records; a replica Ray restarted since counts from zero."""
    from radixcache.runtime.cluster.replica import EngineReplica
    from radixcache.runtime.replay import ReplayConfig, replay

    trace = [TokenRequest(timestamp_ms=0, tokens=tuple(range(1, 14)), output_length=2, session="s")]
    result = replay(front, trace, ReplayConfig(max_tokens=2))
    front.cluster.poll()  # every replica's pages, the warm-up's among them, are in the router's index
    rows = {row["replica"]: row for row in front.per_replica()}
    served = next(r for r, row in rows.items() if row["routed"] == 1)
    measured = result.requests[0]
    assert (rows[served]["prompt_tokens"], rows[served]["cached_tokens"]) == (13, measured.cached_tokens)
    assert rows[served]["indexed_pages"] > 0
    for replica, row in rows.items():
        if replica != served:
            assert (row["routed"], row["prompt_tokens"], row["cached_tokens"], row["hit_rate"]) == (0, 0, 0, 0.0)
            assert row["indexed_pages"] == 0

    idle = next(r for r in rows if r != served)  # Ray restarts it: a new process, its stats from zero
    actor = front.cluster.actor(idle)
    old = actor.obj
    actor.obj = EngineReplica(idle, old.engine.model, ENGINE)
    front.replicas.append(actor.obj.engine)  # closed by the fixture
    old.engine.close()
    actor.obj.generate(list(range(20, 29)), 2, {})  # 9 prompt tokens on the restarted replica
    front.cluster.poll()
    again = {row["replica"]: row for row in front.per_replica()}
    assert again[idle]["prompt_tokens"] == 9  # not 9 - the old process's 8 warm-up tokens


def test_replay_on_replicas_refuses_a_text_trace_the_models_chat_template_cannot_render(
    tmp_path: Any, tiny_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A text trace on a model without a chat template: plain `replay` refuses it before the warm-up, but with
    --replicas it went on to start Ray and every replica, and each turn then failed there. It is refused, in the
    same words, before any replica starts."""
    import json
    import shutil

    from click.testing import CliRunner

    from radixcache.cli import replay as replay_cli
    from radixcache.cli.main import main

    model = shutil.copytree(tiny_dir, tmp_path / "no-template")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    started: list[object] = []
    monkeypatch.setattr(replay_cli, "cluster_engine", lambda *args: started.append(args) or pytest.fail("started"))
    trace = tmp_path / "chats.jsonl"
    trace.write_text('{"id": "a", "turns": [{"user": "hi"}]}\n')
    done = CliRunner().invoke(main, ["replay", str(trace), "--model", str(model), "--replicas", "2"])
    assert done.exit_code == 1 and started == [], done.output
    assert f"{trace} is a text (chat) trace" in done.stderr and "has none" in done.stderr, done.stderr
