"""A cancel that reaches a replica before the request's stream registers there is not lost: the stream, when it
starts, cancels itself (Ray may run the actor's `cancel` before its `stream`). The replica class is plain Python:
tested here without Ray, on the tiny random model; a stream without the early cancel runs to its length."""

from __future__ import annotations

import time

import pytest
import torch

from radixcache.runtime.cluster.replica import EngineReplica
from radixcache.runtime.engine.options import resolve_options
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

MAX_NEW = 400


@pytest.fixture(scope="module")
def replica():
    threads = torch.get_num_threads()
    m = tiny_model(seed=4)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    rep = EngineReplica(0, model, {"capacity_blocks": 256, "page_size": 4})  # type: ignore[arg-type]
    torch.set_num_threads(threads)  # the replica sets its own count: leave the test process's as it was
    yield rep
    rep.engine.close()


def _result(rep: EngineReplica, rid: str):
    options = resolve_options(MAX_NEW, None, {"ignore_eos": True}, "test")
    items = list(rep.stream(rid, list(range(1, 9)), options))
    assert items[-1][0] == "done"
    return items[-1][1]


def test_a_cancel_before_the_stream_registers_cancels_it(replica: EngineReplica) -> None:
    assert replica.cancel("early") is False  # not running here yet
    result = _result(replica, "early")
    assert result.finish_reason == "cancelled" and len(result.token_ids) < MAX_NEW
    assert "early" not in replica._handles and "early" not in replica._early_cancels


@pytest.mark.parametrize("call", ["stream", "generate"])
def test_a_request_cancelled_before_it_arrives_costs_the_engine_nothing(
    replica: EngineReplica, call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The remembered cancel is looked at before the request is submitted: it was submitted first, then cancelled,
    and the engine had admitted it by then (a prefill step of its prompt, often a token)."""
    engine = replica.engine
    submit = engine.submit

    def admitted_before_return(*args, **kwargs):  # a loop as quick as a GPU's: admitted before submit returns
        handle = submit(*args, **kwargs)
        for _ in range(500):
            if handle.request.t_admitted is not None or handle.done():
                break
            time.sleep(0.01)
        return handle

    monkeypatch.setattr(engine, "submit", admitted_before_return)
    before = replica.engine.stats
    rid = f"free-{call}"
    assert replica.cancel(rid) is False
    if call == "stream":
        result = _result(replica, rid)
    else:
        result = replica.generate(list(range(1, 9)), MAX_NEW, {"ignore_eos": True}, rid)
    after = replica.engine.stats
    assert result.finish_reason == "cancelled" and result.token_ids == () and result.prefill_tokens == 0
    assert result.prompt_tokens == 8 and result.text == ""
    assert (after.prompt_tokens, after.prefill_tokens) == (before.prompt_tokens, before.prefill_tokens)
    assert (after.generated_tokens, after.steps) == (before.generated_tokens, before.steps)
    assert rid not in replica._handles and rid not in replica._early_cancels
    assert _result(replica, rid).finish_reason == "length"  # the cancel was used up: the same id runs again


def test_a_stream_without_a_cancel_runs_to_its_length(replica: EngineReplica) -> None:
    result = _result(replica, "plain")
    assert result.finish_reason == "length" and len(result.token_ids) == MAX_NEW


def test_a_generate_given_a_name_is_cancelled_by_it(replica: EngineReplica) -> None:
    """The front door's blocking call (ReplicaCluster.generate) that stops waiting cancels its request by name, as a
    stream's: `generate` took no name, so a request whose wait timed out ran on to its length here."""
    assert replica.cancel("g-early") is False  # its generate has not arrived yet
    result = replica.generate(list(range(1, 9)), MAX_NEW, {"ignore_eos": True}, "g-early")
    assert result.finish_reason == "cancelled" and len(result.token_ids) < MAX_NEW
    assert "g-early" not in replica._handles and "g-early" not in replica._early_cancels
    plain = replica.generate(list(range(1, 9)), MAX_NEW, {"ignore_eos": True}, "g-plain")
    assert plain.finish_reason == "length" and len(plain.token_ids) == MAX_NEW
