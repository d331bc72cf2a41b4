"""A cancel that reaches a replica before the request's stream registers there is not lost: the stream, when it
starts, cancels itself (Ray may run the actor's `cancel` before its `stream`). The replica class is plain Python:
tested here without Ray, on the tiny random model; a stream without the early cancel runs to its length."""

from __future__ import annotations

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
