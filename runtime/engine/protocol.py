"""What the server, the replay, the CLI and the cluster need of an engine: `GenerationEngine`, a Protocol that the
Engine (runtime.engine.engine) and the replicas' front door (runtime.cluster.front.ClusterEngine) both satisfy.

Callers type the engine they are given with it instead of `Any`, so a change to either engine's surface that a
caller relies on is one a type checker (and `isinstance`, for the names) can see. Read-only members are properties
here so that either engine may hold a richer object (the Engine's RadixCache, the front's summary of its replicas).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from radixcache.runtime.config import ModelConfig


class CacheShape(Protocol):
    """The cache's shape, as a caller sizes prompts and reports: pages, tokens per page, the eviction policy."""

    @property
    def capacity_blocks(self) -> int: ...

    @property
    def page_size(self) -> int: ...

    @property
    def policy(self) -> Any: ...  # `.name` names it


class PageCounter(Protocol):
    def pages(self, num_tokens: int) -> int: ...


class QueueGauge(Protocol):
    @property
    def waiting(self) -> int: ...


class GenerationHandle(Protocol):
    """A submitted request (the Engine's RequestHandle, the front's RemoteHandle): its result's future, the
    in-flight request a stream reads (`output_ids`, `logprobs`, `listener`, `sampler.params`), cancel."""

    @property
    def future(self) -> Future[Any]: ...

    @property
    def request(self) -> Any: ...

    def result(self, timeout: float | None = None) -> Any: ...

    def done(self) -> bool: ...

    def cancel(self) -> None: ...


@runtime_checkable
class GenerationEngine(Protocol):
    """An engine the server, the replay and the CLI can drive: requests in (RequestOptions, or its keywords),
    GenerationResults out, and the upkeep a server does (check, wait_idle, close, flush, stats)."""

    @property
    def config(self) -> ModelConfig: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...

    @property
    def enable_cache(self) -> bool: ...

    @property
    def cache(self) -> CacheShape: ...

    @property
    def kv(self) -> PageCounter: ...

    @property
    def queue(self) -> QueueGauge: ...

    @property
    def stats(self) -> Any: ...  # an EngineStats (the front's: its replicas' summed)

    def submit(
        self, prompt: Any, max_new_tokens: int | None = None, **kwargs: Any
    ) -> Any: ...  # options=, or its keywords

    def submit_group(self, prompts: Sequence[Any], max_new_tokens: int | None = None, **kwargs: Any) -> list[Any]: ...

    def generate(self, prompt: Any, max_new_tokens: int | None = None, **kwargs: Any) -> Any: ...

    async def agenerate(self, prompt: Any, max_new_tokens: int | None = None, **kwargs: Any) -> Any: ...

    def record_trace(self, path: Any) -> Any: ...

    def check(self, timeout: float | None = 30.0) -> dict[str, int]: ...

    def flush(self, timeout: float | None = 30.0) -> bool: ...

    def wait_idle(self, timeout: float | None = None) -> bool: ...

    def close(self, timeout: float | None = 30.0) -> bool: ...


class ChatEngine(Protocol):
    """What a Session (runtime.engine.session) needs of its engine: chat turns, sync and async, and forks."""

    def chat(self, messages: Any, max_new_tokens: int | None = None, **kwargs: Any) -> Any: ...

    async def achat(self, messages: Any, max_new_tokens: int | None = None, **kwargs: Any) -> Any: ...

    def fork(self, prefix: Any, n: int = 4, max_new_tokens: int | None = None, **kwargs: Any) -> list[Any]: ...

    def unpin(self, prompt: Any = None, **kwargs: Any) -> int: ...
