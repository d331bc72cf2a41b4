"""The FastAPI application: OpenAI's chat and completions endpoints over one Engine (and its Responses API on the
chat path: runtime.server.responses_route), plus models, health and Prometheus metrics.
`create_app(engine, model_name, api_keys=...)`; `cli/serve.py` runs it under uvicorn.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from radixcache.runtime.engine.protocol import GenerationEngine
from radixcache.runtime.server import generation, legacy, responses_route
from radixcache.runtime.server.body_limit import (
    BODY_GRACE_S,
    DEFAULT_MAX_BODY_BYTES,
    MIN_BODY_RATE,
    BodyLimit,
    check_body_rate,
    check_max_body_bytes,
)
from radixcache.runtime.server.body_parse import off_loop_route
from radixcache.runtime.server.control import ControlReads
from radixcache.runtime.server.error_handlers import add_error_handlers
from radixcache.runtime.server.http_common import (
    STREAM_STALL_S,
    ApiKey,
    ClosingStreamingResponse,
    first_event,
    head_routes,
    prepend,
    tenant,
    until_disconnect,
)
from radixcache.runtime.server.jobs import JobBuilder
from radixcache.runtime.server.json_pieces import PieceJSONResponse
from radixcache.runtime.server.leases import check_lease_defaults
from radixcache.runtime.server.metrics import ServerMetrics
from radixcache.runtime.server.protocol import MAX_CHOICES, APIError, ChatCompletionRequest, CompletionRequest
from radixcache.runtime.server.responses import Responder
from radixcache.runtime.server.responses_input import unicode_checked
from radixcache.runtime.server.responses_store import ResponseStore
from radixcache.runtime.server.structured import grammar_of, render_chat, tool_use_of
from radixcache.runtime.server.tool_turns import check_tool_turns
from radixcache.runtime.tools import tool_template_features

SHUTDOWN_WAIT_S = 30.0


def create_app(
    engine: GenerationEngine,
    model_name: str = "smollm2",
    api_keys: Sequence[str] = (),
    public_metrics: bool = False,
    max_model_len: int | None = None,
    request_timeout: float | None = None,
    lease_defaults: Mapping[str, float] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    stream_stall_timeout: float | None = STREAM_STALL_S,
    body_grace: float = BODY_GRACE_S,
    min_body_rate: float | None = MIN_BODY_RATE,
) -> FastAPI:
    """An OpenAI-compatible app serving `engine` as model `model_name`.

    With `api_keys`, every /v1 request (and /metrics, unless `public_metrics`) needs `Authorization: Bearer KEY`,
    and each key gets its own cache namespace; a request's `cache_salt` splits it further (runtime.server.generation
    .namespace_for). `max_model_len`: the most tokens (prompt + completion) a request may span, at most the model's
    own. `request_timeout`: the most seconds any request may run (a request's `timeout` may only lower it); a
    request that reaches it ends with what it generated. Queue limits live in the engine (`max_queue`,
    `queue_timeout`); their errors become 429 and 503 with Retry-After (runtime.server.errors). `lease_defaults`:
    the `retain_for` seconds of a request that gives none, per API key ("*": every other caller;
    runtime.server.leases). `max_body_bytes`: a request body past it gets 413 before it is read whole
    (runtime.server.body_limit). `stream_stall_timeout`: the most seconds a stream's next chunk may wait for a
    client that stopped reading before the stream is given up and its requests cancelled, and the most a request's
    unfinished body may wait for its next bytes (None: no bound; runtime.server.http_common, body_limit).
    `body_grace`, `min_body_rate`: a body still arriving `body_grace` seconds after its request began plus a second
    per `min_body_rate` bytes it sent gets 408 (None or 0: no rate; runtime.server.body_limit)."""
    if request_timeout is not None and not (math.isfinite(request_timeout) and request_timeout > 0):
        # every request takes it as its own timeout: a bad one would refuse them all, blaming their bodies
        raise ValueError(f"request_timeout must be a finite number of seconds > 0, got {request_timeout}")
    check_max_body_bytes(max_body_bytes)
    check_body_rate(body_grace, min_body_rate)
    if stream_stall_timeout is not None and not (math.isfinite(stream_stall_timeout) and stream_stall_timeout > 0):
        raise ValueError(f"stream_stall_timeout must be a finite number of seconds > 0, got {stream_stall_timeout}")
    keys = frozenset(api_keys)
    leases = check_lease_defaults(lease_defaults)
    inflight = generation.Inflight()
    legacy_calls = legacy.LegacyCalls()  # the ids of calls answered as `function_call` (runtime.server.legacy)
    metrics = ServerMetrics()
    metrics.cancelled = lambda: inflight.cancelled
    control = ControlReads()  # /metrics and /health/cache: never in the threads requests tokenise in
    context = engine.config.max_position if max_model_len is None else min(max_model_len, engine.config.max_position)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        # uvicorn has let in-flight HTTP requests finish (or cancelled them); abort whatever the engine holds.
        inflight.cancel_all()
        await asyncio.to_thread(engine.wait_idle, SHUTDOWN_WAIT_S)
        control.close()

    app = FastAPI(title="radixcache", lifespan=lifespan)
    app.router.route_class = off_loop_route()  # big bodies parsed and validated off the event loop
    app.add_middleware(
        BodyLimit, limit=max_body_bytes, idle=stream_stall_timeout, grace=body_grace, min_rate=min_body_rate
    )
    app.state.engine, app.state.inflight, app.state.metrics, app.state.api_keys = engine, inflight, metrics, keys
    app.state.stream_stall_timeout = stream_stall_timeout

    add_error_handlers(app, engine, metrics, keys)  # after BodyLimit: KeysFirst, when keyed, runs before it

    jobs = JobBuilder(engine, model_name, context, request_timeout, leases)
    check_model, encode, job_for = jobs.check_model, jobs.encode, jobs.job_for

    def token_bytes(token_id: int) -> bytes:
        exact = getattr(engine.tokenizer, "token_bytes", None)
        if exact is not None:
            return exact(token_id)
        return engine.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def decode(ids: Sequence[int]) -> str:
        return engine.tokenizer.decode(list(ids), skip_special_tokens=True)

    def responder(kind: str, job: generation.Job, legacy_reply: legacy.LegacyReply | None = None) -> Responder:
        """`legacy_reply`: set when the request used `functions`: its calls are answered as `function_call`."""
        use = job.options.tool_use
        parsed = use is not None and use.parses_calls
        return Responder(
            kind,
            model_name,
            job.prompt_tokens,
            job.n,
            token_bytes,
            legacy=legacy_reply,
            calls=parsed,
            decode=decode,
            prompts=job.prompts,
            calls_only=use is not None and use.calls_only,
        )

    async def run(request: Request, body: Any, job: generation.Job, responder: Responder) -> Any:
        namespace = job.options.namespace
        if job.max_tokens == 0:  # OpenAI answers an empty completion; the engine needs at least one step
            asked = job.options.retain_for is not None
            if body.stream:
                events = responder.empty_stream(job.choices, body.include_usage(), asked)
                return StreamingResponse(iter(events), media_type="text/event-stream")
            return JSONResponse(responder.empty(job.choices, asked, job.options.sampling.logprobs is not None))
        if body.stream:
            events = generation.stream(engine, job, inflight)
            # Wait for the first event before answering 200: a refusal (full queue, queue timeout) is still an
            # HTTP status then, not an error inside a stream.
            first = await until_disconnect(request, first_event(events))
            want = job.options.sampling.logprobs is not None
            sse = responder.sse(prepend(first, events), body.include_usage(), metrics, want, namespace)
            return ClosingStreamingResponse(sse, media_type="text/event-stream")
        results = await until_disconnect(request, generation.complete(engine, job, inflight))
        for r in results:
            metrics.observe(r, namespace)
        metrics.requests_ok += 1
        responder.remember(results)

        if job.options.sampling.logprobs is None:
            return JSONResponse(responder.whole(results, lambda r: generation.shown_tokens(engine, r)))
        # Logprobs are a dict per alternative of every token (n=16 x 2,000 tokens x 20: 41 MB of JSON), seconds of
        # building and encoding: off the event loop, where they stalled every stream and /health that long, and
        # encoded in pieces, as json.dumps holds the GIL for its whole call (runtime.server.json_pieces).
        return await asyncio.to_thread(
            lambda: PieceJSONResponse(responder.whole(results, lambda r: generation.shown_tokens(engine, r)))
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest, key: ApiKey) -> Any:
        check_model(body.model)
        body.refuse_unsupported()
        if not body.messages:
            raise APIError(400, "messages must be a non-empty list", param="messages")
        messages = [m.as_dict(i) for i, m in enumerate(body.messages)]
        # a lone surrogate (JSON can spell one) in a content part, a call or a tool, named by its path: pydantic
        # names one in a string field, but these are free-form, and the tokenizer's refusal could not say where
        for i, m in enumerate(messages):
            unicode_checked(m, f"messages.{i}")
        for name in ("tools", "functions"):
            unicode_checked(getattr(body, name), name)
        grammar, use = await asyncio.to_thread(lambda: (grammar_of(body), tool_use_of(body)))  # ~0.5 s checks
        namespace = generation.namespace_for(key, body.cache_salt)
        reply = legacy_calls.reply_to(messages, namespace) if legacy.is_legacy(body) else None
        sent = messages
        if any(m["role"] == "function" or "function_call" in m for m in messages):
            id_length = tool_template_features(engine.tokenizer).call_id_length  # Mistral's 9, say
            messages = legacy.legacy_messages(messages, legacy_calls, namespace, id_length)
        check_tool_turns(messages, sent)  # each call answered, each result a call's (runtime.server.tool_turns)
        # Rendering and tokenising a long history take milliseconds: off the event loop, as submitting is.
        ids = await asyncio.to_thread(lambda: encode(render_chat(engine, messages, use, namespace)))
        job = job_for(body, [ids], namespace, request, key, grammar=grammar, tool_use=use)
        return await run(request, body, job, responder("chat.completion", job, reply))

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest, key: ApiKey) -> Any:
        check_model(body.model)
        body.refuse_unsupported()
        vocab = engine.config.vocab_size

        def tokenised() -> list[list[int]]:
            prompts = []
            for i, prompt in enumerate(body.prompts()):
                ids = encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
                if any(not 0 <= t < vocab for t in ids):
                    raise APIError(400, f"prompt {i}: token ids must be in [0, {vocab})", param="prompt")
                prompts.append(ids)
            return prompts

        prompts = await asyncio.to_thread(tokenised)  # up to 64 prompts: off the event loop, as chat's is
        if len(prompts) * body.n > MAX_CHOICES:
            raise APIError(400, f"at most {MAX_CHOICES} choices (prompts x n) per request", param="prompt")
        namespace = generation.namespace_for(key, body.cache_salt)
        job = job_for(body, prompts, namespace, request, key, grammar=await asyncio.to_thread(grammar_of, body))
        return await run(request, body, job, responder("text_completion", job))

    chat = responses_route.ChatPath(engine, model_name, inflight, metrics, check_model, encode, job_for)
    responses_route.add_routes(app, chat, ResponseStore())  # OpenAI's Responses API, on the chat path

    @app.get("/v1/models")
    async def models(_: ApiKey) -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(model_name, context)]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str, _: ApiKey) -> dict[str, Any]:
        check_model(name)
        return _model_card(model_name, context)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health/cache")
    async def cache_health(request: Request) -> dict[str, Any]:
        """The cache's invariants, checked between two engine steps, and its block gauges (private like /metrics).
        A broken invariant is a bug: a 500."""
        if not public_metrics:
            tenant(request)
        gauges = await control.run("check", engine.check)
        return {"invariants": "ok", **gauges, "queued": engine.queue.waiting}

    @app.get("/metrics")
    async def prometheus(request: Request) -> PlainTextResponse:
        if not public_metrics:  # every tenant's traffic and timings: as private as the API itself
            tenant(request)
        text = await control.run("metrics", metrics.render, engine, model_name)  # replicas: Ray calls, off the loop
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    head_routes(app)  # HEAD wherever GET is: uptime monitors probe with it
    return app


_STARTED = int(time.time())


def _model_card(name: str, context: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": _STARTED, "owned_by": "radixcache", "max_model_len": context}
