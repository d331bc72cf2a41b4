"""A request body to a `generation.Job`, with the checks that come before the engine: the model named, the prompt
tokenised (a text too long for the context refused untokenised) and bounded by the context and the KV pool,
`logit_bias` within the vocabulary, the completion's length within the context, the session and the lease.
`JobBuilder` is built once per app (runtime.server.app); the chat, completions and Responses routes share it."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from fastapi import Request

from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.engine.protocol import GenerationEngine
from radixcache.runtime.loading.prompt_bound import may_be_too_long, token_bytes_bound, too_long
from radixcache.runtime.server import generation
from radixcache.runtime.server.leases import retain_for
from radixcache.runtime.server.protocol import MAX_LABEL_CHARS, APIError
from radixcache.runtime.tools import tool_template_features
from radixcache.runtime.tools.call_tokens import call_token_ids

DEFAULT_MAX_TOKENS = 256
SESSION_HEADER = "x-session-id"  # a request's session after prompt_cache_key and user; behind replicas it sticks to one


class JobBuilder:
    """One app's checks and jobs over `engine` served as `model_name`: `context` is the most tokens a request may
    span, `request_timeout` the most seconds it may run, `leases` the per-key default `retain_for`."""

    def __init__(
        self,
        engine: GenerationEngine,
        model_name: str,
        context: int,
        request_timeout: float | None,
        leases: Mapping[str, float],
    ) -> None:
        self.engine, self.model_name, self.context = engine, model_name, context
        self.request_timeout, self.leases = request_timeout, leases
        # the tokenizer's longest token in bytes: once, at the first prompt that may not fit (prompt_bound)
        self._per_token = functools.cache(lambda: token_bytes_bound(engine.tokenizer))

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(
                404,
                f"The model `{name}` does not exist.",
                type="invalid_request_error",
                param="model",
                code="model_not_found",
            )

    def encode(self, text: str) -> list[int]:
        """The prompt's ids; a text too long to fit the context is refused untokenised (loading.prompt_bound)."""
        context = self.context
        size = too_long(text, context, self._per_token() if may_be_too_long(text, context) else None)
        if size is not None:
            raise APIError(
                400,
                f"This model's maximum context length is {context} tokens. However, your prompt has {size:,} bytes "
                f"of text, more than {context} tokens of this model hold (at most {self._per_token()} bytes each).",
                code="context_length_exceeded",
            )
        return list(self.engine.tokenizer.encode(text))

    def check_prompt(self, body: Any, prompt_ids: list[int]) -> None:
        context, engine = self.context, self.engine
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", param="messages" if hasattr(body, "messages") else "prompt")
        if len(prompt_ids) >= context:
            raise APIError(
                400,
                f"This model's maximum context length is {context} tokens. However, your prompt has "
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

    def job_for(
        self,
        body: Any,
        prompts: list[list[int]],
        namespace: Any,
        request: Request | None = None,
        key: str | None = None,
        **structured: Any,
    ) -> generation.Job:
        context, engine = self.context, self.engine
        for ids in prompts:
            self.check_prompt(body, ids)
        vocab = engine.config.vocab_size
        for token in body.logit_bias or {}:  # the engine refuses them too, but cannot name the field
            if int(token) >= vocab:
                raise APIError(
                    400,
                    f"logit_bias: token id {token} is outside the vocabulary [0, {vocab})",
                    param=f"logit_bias.{token}",
                )
        longest = max(len(p) for p in prompts)
        asked = body.requested_tokens()
        if asked is not None and longest + asked > context:
            raise APIError(
                400,
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{longest + asked} tokens ({longest} in the prompt, {asked} in the completion). Reduce the "
                "prompt or the completion length.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        max_tokens = max(min(body.limit(DEFAULT_MAX_TOKENS), context - longest), 0)
        request_timeout = self.request_timeout
        timeout = body.timeout if request_timeout is None else min(body.timeout or request_timeout, request_timeout)
        session = body.prompt_cache_key or body.user or (_session_header(request) if request is not None else None)
        if session and getattr(engine, "routes_sessions", False):  # replicas: a session sticks to one (per tenant)
            session = f"{namespace}|{session}"
        # One RequestOptions per HTTP request (0 tokens: an empty completion, which never reaches the engine).
        options = RequestOptions.of(
            max(max_tokens, 1),
            caller="create_app",
            **body.sampling(),
            namespace=namespace,
            timeout=timeout,
            retain=body.retain,
            retain_for=retain_for(body.retain_for, key, self.leases),
            session=session or None,
            **structured,  # grammar= and tool_use= (runtime.server.structured)
        )
        tool_format = tool_template_features(engine.tokenizer).format
        use = options.tool_use
        kept = call_token_ids(engine.tokenizer, tool_format) if use is not None and use.parses_calls else frozenset()
        return generation.Job(prompts, body.n, max_tokens, options, tool_format, kept)


def _session_header(request: Request) -> str | None:
    """The X-Session-Id header, bounded as the `user` field is: behind replicas the router remembers up to 100,000
    sessions, so an unbounded one would let each request pin kilobytes of the front door's memory."""
    session = request.headers.get(SESSION_HEADER)
    if session is not None and len(session) > MAX_LABEL_CHARS:
        raise APIError(
            400, f"X-Session-Id: at most {MAX_LABEL_CHARS} characters, got {len(session)}", param="X-Session-Id"
        )
    return session
