"""An agent's tool loop through the front door (`serve --replicas`): the front door remembers what the replica's
model wrote for each call (runtime.cluster.front.ClusterEngine.tool_memory), so the next turn's prompt is the one a
single Engine renders, token for token, and hits the replica's cache as much as one Engine's; the call ids a stream
sends are those of the result (and of the memory). Over HTTP, without Ray: the real replica class in-process
(tests/cluster/inproc_ray.py) on SmolLM2, which under the grammar writes its calls' JSON in token splits the
tokenizer would not make (`"` then `}}`), so a call re-encoded from the client's JSON differs from what it computed
(before, each turn missed about a page of the last one's reply). The stand-in copies what crosses it by pickle, as
Ray does between processes (the request's options with its tools, the replica's results with the ids it emitted).
The last test, in the extended tier, runs the same on a real local Ray cluster, the replica in its own process."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from radixcache.runtime.server.structured import render_chat
from radixcache.runtime.tools import ToolUse
from radixcache.runtime.tools.use import CallIds
from tests.smollm2_tools import TOOLS

# The SmolLM2 tests share a worker with tests/runtime/structured's (xdist group "structured_smollm2"); the Ray one
# is in the group "ray" alone: pytest-xdist joins every group a test is marked with ("ray_structured_smollm2", a
# group of its own, which ran its Ray cluster beside the "ray" group's on the other worker).
pytestmark = pytest.mark.slow
PAGE = 16
GGUF = {"page_size": PAGE, "quant": "gguf"}  # the real-Ray replica's engine: SmolLM2's Q4_1 blocks, as `model`'s
FIRST = [
    {"role": "developer", "content": "You are an agent. Call tools."},
    {"role": "user", "content": "Weather in Paris, then add 2 and 3, then search for Paris museums."},
]


def _body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "model": "smollm2",
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,  # SmolLM2 repeats its call to the length limit otherwise
        "max_tokens": 160,
        "temperature": 0,
        **extra,
    }


@pytest.fixture
def numbered_ids(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Call ids numbered from 0 where the engine and the front door draw them, again after each call of the
    returned reset: one conversation gets the same ids (they are in its prompts) on one Engine and behind the front
    door, where the replica's engine draws ids of its own too."""
    from radixcache.runtime.cluster import front
    from radixcache.runtime.engine import request_builder
    from radixcache.runtime.server import generation

    modules = (front, request_builder, generation)
    counters: dict[str, Iterator[int]] = {}

    def reset() -> None:
        counters.update({m.__name__: itertools.count() for m in modules})

    for module in modules:
        ids = (lambda name: lambda **kw: CallIds(f"{next(counters[name]):016x}", **kw))(module.__name__)
        monkeypatch.setattr(module, "CallIds", ids, raising=False)
    return reset


@pytest.fixture
def model(smollm2_gguf_model: Any) -> Any:
    return smollm2_gguf_model  # quant="gguf", built once per worker (tests/conftest.py): read by every replica


@pytest.fixture
def single(model: Any, smollm2_gguf: Any) -> Iterator[tuple[TestClient, Any]]:
    from radixcache.runtime import Engine
    from radixcache.runtime.server import create_app

    engine = Engine(model, tokenizer=smollm2_gguf.tokenizer, page_size=PAGE)
    with engine, TestClient(create_app(engine, "smollm2")) as client:
        yield client, engine


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch, model: Any, smollm2_gguf: Any) -> Iterator[tuple[TestClient, Any]]:
    from tests.cluster.inproc_ray import install

    ray = install(monkeypatch, pickled=True)  # arguments, results and streamed items copied as Ray copies them
    from radixcache.runtime import loading
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.server import create_app

    monkeypatch.setattr(loading, "load_config_and_tokenizer", lambda _m: (model.config, smollm2_gguf.tokenizer))
    threads = torch.get_num_threads()
    kwargs = {"tokenizer": smollm2_gguf.tokenizer, "page_size": PAGE}
    cluster = ReplicaCluster(model, 2, engine_kwargs=kwargs, threads=threads, poll_interval=None)  # type: ignore[arg-type]
    engine = ClusterEngine(cluster, model)  # type: ignore[arg-type]
    try:
        with TestClient(create_app(engine, "smollm2")) as client:
            yield client, engine
    finally:
        engine.close()
        for actor in ray.actors:
            actor.obj.engine.close()
        torch.set_num_threads(threads)


def _streamed(client: TestClient, body: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The calls a stream assembles (ids from its deltas) and its usage."""
    calls: dict[int, dict[str, Any]] = {}
    usage = None
    with client.stream(
        "POST", "/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                for d in choice["delta"].get("tool_calls") or ():
                    call = calls.setdefault(
                        d["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                    call["id"] = d.get("id") or call["id"]
                    fn = d.get("function") or {}
                    call["function"]["name"] += fn.get("name") or ""
                    call["function"]["arguments"] += fn.get("arguments") or ""
    assert calls and usage is not None
    return [calls[i] for i in sorted(calls)], usage


def _turn(
    client: TestClient, messages: list[dict[str, Any]], stream: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    if stream:
        return _streamed(client, _body(messages))
    r = client.post("/v1/chat/completions", json=_body(messages))
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["tool_calls"], message
    return message["tool_calls"], r.json()["usage"]


def _loop(client: TestClient, engine: Any, stream: bool) -> tuple[list[list[int]], list[int]]:
    """Two tool turns and a third request, replayed as an OpenAI client does (ids, names, arguments, null
    content): each turn's prompt ids and cached tokens."""
    messages = list(FIRST)
    prompts, cached = [], []
    for step in range(3):
        prompts.append(
            list(engine.tokenizer.encode(render_chat(engine, messages, ToolUse.of(TOOLS, "required", False))))
        )
        calls, usage = _turn(client, messages, stream)
        cached.append(usage["prompt_tokens_details"]["cached_tokens"])
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": f"ok {step}"} for c in calls]
    return prompts, cached


@pytest.mark.xdist_group("structured_smollm2")
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_loop_through_the_front_door_hits_the_cache_as_one_engine(
    single: tuple[TestClient, Any], front: tuple[TestClient, Any], numbered_ids: Any, stream: bool
) -> None:
    numbered_ids()
    want_prompts, want_cached = _loop(*single, stream)
    numbered_ids()
    got_prompts, got_cached = _loop(*front, stream)
    assert got_prompts == want_prompts  # token for token: the replica's emitted ids spliced in
    assert got_cached == want_cached
    assert want_cached[2] > want_cached[1] > 0


# Extended tier (tests/conftest.py): test_a_tool_loop_through_the_front_door_hits_the_cache_as_one_engine above makes
# the same loop with the same assertions on the real replica class in this process, its calls' arguments, results
# and streamed items copied by pickle as Ray copies them. 48.7 s of the last full run under load.
@pytest.mark.extended
@pytest.mark.xdist_group("ray")  # one Ray cluster at a time (tests/cluster/conftest.py)
def test_on_real_ray_a_tool_loop_hits_the_cache_as_one_engine(
    local_ray: str, smollm2_gguf: Any, model: Any, numbered_ids: Any
) -> None:
    """The same through Ray: the emitted ids cross from the replica's process with its result (the replica's own
    call ids are its own there; the front door's are numbered here, as the single Engine's). The replica loads
    "smollm2" with quant="gguf" (its Q4_1 blocks, as the in-process tests above run it: decode about twice as fast
    as float32's); the single Engine runs the same, as `Engine("smollm2", quant="gguf")` builds it (`model`)."""
    from radixcache.runtime import Engine
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.server import create_app

    threads = torch.get_num_threads()
    try:
        numbered_ids()
        single = Engine(model, tokenizer=smollm2_gguf.tokenizer, page_size=PAGE, threads=1)
        with single as engine, TestClient(create_app(engine, "smollm2")) as c:
            want_prompts, want_cached = _loop(c, engine, stream=True)
        numbered_ids()
        with ReplicaCluster("smollm2", 1, engine_kwargs=GGUF, poll_interval=None) as cluster:
            front = ClusterEngine(cluster, "smollm2")
            with TestClient(create_app(front, "smollm2")) as client:
                got_prompts, got_cached = _loop(client, front, stream=True)
    finally:
        torch.set_num_threads(threads)
    assert got_prompts == want_prompts
    assert got_cached == want_cached
    assert want_cached[2] > want_cached[1] > 0
