"""`ClusterEngine.unpin` takes what `Engine.unpin` takes: chat messages with the `tools=` (or `options=`) of the
request that pinned them (the front door took a prompt and `namespace=` only: messages were a ValueError, 'prompt[0]
must be a token id', and `tools=` a TypeError, so an agent that pinned its tool prompt behind replicas could release
it only by rendering it itself). On the tiny checkpoint's ChatML template, which renders tools: real replica engines
in this process (the in-process Ray stand-in, tests/cluster/inproc_ray.py), and, in the extended tier, real replicas
on a local Ray cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixcache.runtime import RequestOptions
from radixcache.runtime.server.structured import render_chat
from tests.cluster.inproc_ray import install
from tests.tiny_tools import TOOLS

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is the weather"}]
ENGINE = {"capacity_blocks": 1024, "page_size": 16}  # the tools render to about 1,000 tokens


# local_ray and tiny_dir: tests/cluster/conftest.py


def _check_unpin(engine: Any) -> None:
    """A pin made with tools and one made in a namespace, released through ClusterEngine.unpin as Engine.unpin takes
    them; a keyword it does not take and an unhashable namespace are refused."""
    tools = RequestOptions.of(1, pin=True, tools=TOOLS, tool_choice="none")
    plain = RequestOptions.of(1, pin=True, namespace="t")
    # pinned as the server sends a chat: rendered at the front door, with the tools
    assert engine.generate(render_chat(engine, MESSAGES, tools.tool_use), options=tools).pinned_tokens > 0
    assert engine.generate(render_chat(engine, MESSAGES, None, "t"), options=plain).pinned_tokens > 0
    pinned = engine.stats.pinned_blocks
    assert pinned > 0
    assert engine.unpin(MESSAGES) == 0, "rendered without the tools: another prompt, whose pin there is none"
    assert engine.unpin(MESSAGES, tools=TOOLS, tool_choice="none") == 1
    assert 0 < engine.stats.pinned_blocks < pinned
    assert engine.unpin(MESSAGES, options=plain) == 1  # its namespace "t", from the options
    assert engine.stats.pinned_blocks == 0 and engine.check()["locked_blocks"] == 0
    with pytest.raises(TypeError, match=r"ClusterEngine\.unpin"):
        engine.unpin(MESSAGES, tool=TOOLS)
    with pytest.raises(ValueError, match="namespace must be hashable"):
        engine.unpin(MESSAGES, namespace=["t"])


def _front_door(tiny_dir: Path) -> Any:
    """A ClusterEngine over two round-robin replicas of the tiny checkpoint (on whatever `ray` is installed)."""
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster(str(tiny_dir), 2, router="round_robin", engine_kwargs=ENGINE, poll_interval=None)
    return ClusterEngine(cluster, str(tiny_dir))


def test_unpin_takes_the_messages_and_tools_a_pin_was_made_with_in_process(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    """The front door's unpin over two real replica engines run in this process (no Ray: what is checked is the
    front door's rendering and fan-out, the same calls the Ray test below makes)."""
    ray = install(monkeypatch)
    threads = torch.get_num_threads()
    engine = _front_door(tiny_dir)
    try:
        _check_unpin(engine)
    finally:
        engine.close()
        for actor in ray.actors:
            actor.obj.engine.close()
        torch.set_num_threads(threads)


# Extended tier (tests/conftest.py): the test above makes the same calls with the same assertions on the real replica
# class and engines in this process. What only Ray adds is pickling: the replica's unpin takes plain values (token
# ids, the namespace, a flag, the holder), and a request's options with tools cross the pickling stand-in in the
# default run's in-process tool loop (test_front_door_tools.py). 17.1 s of the last full run under load.
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.xdist_group("ray")  # one Ray cluster at a time
def test_unpin_takes_the_messages_and_tools_a_pin_was_made_with(local_ray: str, tiny_dir: Path) -> None:
    engine = _front_door(tiny_dir)
    try:
        _check_unpin(engine)
    finally:
        engine.close()
