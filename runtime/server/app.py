"""The FastAPI application: OpenAI's chat and completions endpoints over one Engine, plus models, health and
Prometheus metrics. `create_app(engine, model_name, api_keys=...)`; `cli/serve.py` runs it under uvicorn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from radixcache.runtime.server import generation
from radixcache.runtime.server.metrics import ServerMetrics
from radixcache.runtime.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, validation_message
from radixcache.runtime.server.responses import Responder

DEFAULT_MAX_TOKENS = 256
SHUTDOWN_WAIT_S = 30.0


def create_app(
    engine: Any, model_name: str = "smollm2", api_keys: Sequence[str] = (), public_metrics: bool = False
) -> FastAPI:
    """An OpenAI-compatible app serving `engine` as model `model_name`. With `api_keys`, every /v1 request
    needs `Authorization: Bearer KEY`, and each key gets its own cache namespace."""
    keys = frozenset(api_keys)
    inflight = generation.Inflight()
    metrics = ServerMetrics()
    metrics.cancelled = lambda: inflight.cancelled

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        # uvicorn has let in-flight HTTP requests finish (or cancelled them); abort whatever the engine holds.
        inflight.cancel_all()
        await asyncio.to_thread(engine.wait_idle, SHUTDOWN_WAIT_S)

    app = FastAPI(title="radixcache", lifespan=lifespan)
    app.state.engine, app.state.inflight, app.state.metrics, app.state.api_keys = engine, inflight, metrics, keys

    @app.middleware("http")
    async def _auth_first(request: Request, call_next: Any) -> Any:
        """With keys, /v1 refuses an unauthenticated request before even parsing its body (as OpenAI does)."""
        if keys and request.url.path.startswith("/v1"):
            try:
                _tenant(request)
            except APIError as exc:
                return await _api_error(request, exc)
        return await call_next(request)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        metrics.requests_failed += 1
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()))
        return await _api_error(_, APIError(400, message, param=param))

    @app.exception_handler(ValueError)
    async def _refused(_: Request, exc: ValueError) -> JSONResponse:  # a value the engine refuses
        return await _api_error(_, APIError(400, str(exc)))

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return await _api_error(_, APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error"))

    def check_model(name: str) -> None:
        if name != model_name:
            raise APIError(
                404,
                f"The model `{name}` does not exist.",
                type="invalid_request_error",
                param="model",
                code="model_not_found",
            )

    def encode(text: str) -> list[int]:
        return list(engine.tokenizer.encode(text))

    def job_for(body: Any, prompt_ids: list[int], namespace: Any) -> generation.Job:
        limit = engine.config.max_position
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", param="messages" if hasattr(body, "messages") else "prompt")
        if len(prompt_ids) >= limit:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt has "
                f"{len(prompt_ids)} tokens.",
                code="context_length_exceeded",
            )
        pages, capacity, page = engine.kv.pages(len(prompt_ids)), engine.cache.capacity_blocks, engine.cache.page_size
        if pages > capacity:  # it could never be admitted: say so now, with the numbers (not a 500 later)
            raise APIError(
                400,
                f"This server's KV pool holds {capacity * page} tokens ({capacity} pages of {page}). However, your "
                f"prompt has {len(prompt_ids)} tokens ({pages} pages). Shorten it, or start the server with a "
                "larger --kv-memory.",
                code="context_length_exceeded",
            )
        max_tokens = body.limit(DEFAULT_MAX_TOKENS)
        kwargs = {"temperature": body.temperature, "top_p": body.top_p, "seed": body.seed, "namespace": namespace}
        if body.stop_list():
            kwargs["stop"] = body.stop_list()
        return generation.Job(prompt_ids, body.n, max(max_tokens, 0), kwargs)

    async def run(request: Request, body: Any, job: generation.Job, responder: Responder) -> Any:
        if job.max_tokens == 0:  # OpenAI answers an empty completion; the engine needs at least one step
            return JSONResponse(responder.empty(job))
        if body.stream:
            events = generation.stream(engine, job, inflight)
            sse = responder.sse(events, body.include_usage(), metrics)
            return StreamingResponse(sse, media_type="text/event-stream")
        task = asyncio.create_task(generation.complete(engine, job, inflight))
        gone = asyncio.create_task(_disconnect(request))
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not task.done():  # the client went away: cancel its engine requests
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise APIError(499, "client disconnected")
        results = task.result()
        for r in results:
            metrics.observe(r)
        metrics.requests_ok += 1
        return JSONResponse(responder.whole(results))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest, namespace: Tenant) -> Any:
        check_model(body.model)
        body.refuse_unsupported()
        if not body.messages:
            raise APIError(400, "messages must be a non-empty list", param="messages")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except Exception as exc:  # a template that rejects this conversation (say, roles out of order)
            raise APIError(400, f"the chat template refused these messages: {exc}", param="messages") from None
        job = job_for(body, encode(text), namespace)
        return await run(request, body, job, Responder("chat.completion", model_name, len(job.prompt_ids)))

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest, namespace: Tenant) -> Any:
        check_model(body.model)
        body.refuse_unsupported()
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "batched prompts are not supported; send one prompt per request", param="prompt")
            prompt = prompt[0]
        ids = encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        vocab = engine.config.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise APIError(400, f"token ids must be in [0, {vocab})", param="prompt")
        job = job_for(body, ids, namespace)
        return await run(request, body, job, Responder("text_completion", model_name, len(job.prompt_ids)))

    @app.get("/v1/models")
    async def models(_: Tenant) -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(model_name)]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str, _: Tenant) -> dict[str, Any]:
        check_model(name)
        return _model_card(model_name)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus(request: Request) -> PlainTextResponse:
        if not public_metrics:  # every tenant's traffic and timings: as private as the API itself
            _tenant(request)
        return PlainTextResponse(metrics.render(engine, model_name), media_type="text/plain; version=0.0.4")

    return app


_STARTED = int(time.time())


async def _disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read; only the disconnect is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _tenant(request: Request) -> Any:
    """The caller's cache namespace; 401 when keys are configured and the caller has none of them."""
    keys = request.app.state.api_keys
    if not keys:
        return None
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or token.strip() not in keys:
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")
    return generation.namespace_for(token.strip())


Tenant = Annotated[Any, Depends(_tenant)]


def _model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": _STARTED, "owned_by": "radixcache"}
