"""OpenAI's Responses API on the chat path: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`, and
`GET /v1/responses/{id}/input_items`.

A request is translated into the chat endpoint's body (runtime.server.responses_input: messages, tools,
tool_choice, response_format, sampling, session), rendered, checked and run by the chat path's own code (the
model's chat template with the engine's call memory, `job_for`, runtime.server.generation, the tool-call parser and
the grammar), and its result translated back (runtime.server.responses_output, runtime.server.responses_stream).

`previous_response_id` rebuilds the conversation from the stored response (runtime.server.responses_store), so a
follow-up sends only its new items (the `function_call_output` of a call, the next user message); the rebuilt
prompt is the previous prompt and reply followed by the new turn, which the radix cache serves. `instructions` is
not carried over from the previous response (as OpenAI's): each request gives its own. A follow-up to a response that
made calls answers each with a `function_call_output` item, else it is OpenAI's 400 "No tool output found for
function call <call_id>" (a call cut short was not made: it needs none), as is a whole `function_call` of the
request's own input that no output answers (named `input.i.call_id`); a `function_call_output` that answers no
call of the conversation is OpenAI's 400 "No tool call found for function call output with call_id <call_id>", and
a second `function_call_output` for one call (in input, or after one in the chain) a 400 "Duplicate value for
'call_id'" naming its `input.i.call_id`, as the chat path refuses a second tool message for one call.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse

from radixcache.runtime.engine.protocol import GenerationEngine
from radixcache.runtime.grammar.errors import GrammarError
from radixcache.runtime.server import generation
from radixcache.runtime.server.http_common import (
    ApiKey,
    ClosingStreamingResponse,
    first_event,
    prepend,
    until_disconnect,
)
from radixcache.runtime.server.protocol import MAX_LABEL_CHARS, APIError
from radixcache.runtime.server.responses_input import (
    PREVIOUS,
    chat_body,
    items_of,
    listed,
    messages_of,
    renamed,
    replayed,
    unique_ids,
)
from radixcache.runtime.server.responses_output import ResponseBuilder, arguments_closed
from radixcache.runtime.server.responses_protocol import ResponsesRequest
from radixcache.runtime.server.responses_store import ResponseStore
from radixcache.runtime.server.responses_stream import ResponseStream
from radixcache.runtime.server.structured import bad_request, grammar_of, render_chat, tool_use_of
from radixcache.runtime.tools.errors import ToolInputError


@dataclass(frozen=True)
class ChatPath:
    """What the Responses routes use of create_app's chat endpoint."""

    engine: GenerationEngine
    model_name: str
    inflight: generation.Inflight
    metrics: Any
    check_model: Callable[[str], None]
    encode: Callable[[str], list[int]]
    job_for: Callable[..., generation.Job]


def _answered(output: list[dict[str, Any]], own: list[dict[str, Any]]) -> None:
    """A 400, as OpenAI's, when a call the previous response made (`output`) has no output among the follow-up's own
    items: the model would go on as if it had run (the chat path renders a turn without its tool message)."""
    outputs = {item["call_id"] for item in own if item["type"] == "function_call_output"}
    calls = [i for i in output if i.get("type") == "function_call"]
    made = [i["call_id"] for i in calls if arguments_closed(i.get("arguments", ""))]
    missing = next((call_id for call_id in made if call_id not in outputs), None)
    if missing is not None:
        raise APIError(
            400,
            f"No tool output found for function call {missing}: a follow-up by previous_response_id answers each call "
            "of that response with a function_call_output item in input",
            param="input",
        )


def _called(history: list[dict[str, Any]], own: list[dict[str, Any]], where: list[str]) -> None:
    """A 400, as OpenAI's, naming the first of the request's own `function_call_output` items whose `call_id` no
    `function_call` of the conversation (`history`: the stored chain and the previous response's output; `own`,
    before it) has: an answer to no call, which the model would read as one; or whose call an output before it (in
    input, or in the chain) answered already: two results for one call, as the chat path refuses them. Then OpenAI's
    "No tool output found" naming the first whole `function_call` of the request's own that no output answers."""
    calls: Counter[str] = Counter()  # a client may give two calls one id: each is answered once
    answered: dict[str, list[str]] = {}  # each call id: the origins of its outputs so far
    for item, origin in [*((i, PREVIOUS) for i in history), *zip(own, where, strict=True)]:
        kind, call_id = item.get("type"), item.get("call_id")
        if kind == "function_call":
            calls[call_id] += 1
        if kind != "function_call_output":
            continue
        if origin != PREVIOUS and call_id not in calls:
            raise APIError(
                400,
                f"No tool call found for function call output with call_id {call_id}: {origin} answers no "
                "function_call of the conversation (in input before it, or of previous_response_id's)",
                param=f"{origin}.call_id",
            )
        earlier = answered.setdefault(call_id, [])
        if origin != PREVIOUS and len(earlier) >= calls[call_id]:
            raise APIError(
                400,
                f"Invalid parameter: Duplicate value for 'call_id' of '{call_id}', in {earlier[0]} and {origin}: "
                "each function_call is answered by one function_call_output item",
                param=f"{origin}.call_id",
            )
        earlier.append(origin)
    for item, origin in zip(own, where, strict=True):  # a call of the request's own that no output answers
        call_id = item.get("call_id")
        whole = item["type"] == "function_call" and arguments_closed(item.get("arguments", ""))
        if whole and not answered.get(call_id):
            raise APIError(
                400,
                f"No tool output found for function call {call_id}: {origin} is answered by no function_call_output "
                "item in input (a call cut short needs none)",
                param=f"{origin}.call_id",
            )
        if whole:
            answered[call_id].pop()


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"No response found with id '{response_id}'.", param="response_id", code="not_found")


async def _named(sources: list[list[str]], work: Awaitable[Any]) -> Any:
    """`work`'s result; a bad schema or tool the engine refuses when the job is submitted (a grammar no text
    satisfies, a schema it cannot compile) is a 400 naming the Responses field, as one refused before it."""
    try:
        return await work
    except (GrammarError, ToolInputError) as exc:
        raise renamed(bad_request(exc), sources) from None


def add_routes(app: FastAPI, chat: ChatPath, store: ResponseStore) -> None:
    app.state.responses = store

    def history(body: ResponsesRequest, key: str | None) -> tuple[list[dict[str, Any]], list[str]]:
        """The conversation's canonical items (the previous response's, then this request's) and their origins."""
        prior: list[dict[str, Any]] = []
        made: list[dict[str, Any]] = []  # the previous response's output, whose calls this request answers
        if body.previous_response_id is not None:
            entry = store.get(key, body.previous_response_id)
            if entry is None:
                raise APIError(
                    400,
                    f"Previous response with id '{body.previous_response_id}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            prior, made = entry.items + replayed(entry.output), entry.output
        own = items_of(body)
        if not own:
            raise APIError(400, "input must not be empty", param="input")
        _answered(made, own)
        where = ["input"] if isinstance(body.input, str) else [f"input.{i}" for i in range(len(own))]
        _called(prior + made, own, where)
        items, origins = prior + own, [PREVIOUS] * len(prior) + where
        unique_ids(items, origins)
        return items, origins

    @app.post("/v1/responses")
    async def create_response(request: Request, body: ResponsesRequest, key: ApiKey) -> Any:
        chat.check_model(body.model)
        body.refuse_unsupported()
        items, origins = history(body, key)
        messages, sources = messages_of(items, origins, body.instructions)
        chat_request = chat_body(body, messages, sources)
        try:
            grammar, use = await asyncio.to_thread(lambda: (grammar_of(chat_request), tool_use_of(chat_request)))
            rendered = [m.as_dict(i) for i, m in enumerate(chat_request.messages)]
            namespace = generation.namespace_for(key, body.cache_salt)
            ids = await asyncio.to_thread(lambda: chat.encode(render_chat(chat.engine, rendered, use, namespace)))
            job = chat.job_for(chat_request, [ids], namespace, request, key, grammar=grammar, tool_use=use)
        except APIError as exc:
            raise renamed(exc, sources) from None
        builder = ResponseBuilder(body, chat.model_name, job.prompt_tokens)

        def keep(response: dict[str, Any]) -> None:
            if body.stored:
                store.put(key, response, items, response["output"])

        if body.stream:
            events = generation.stream(chat.engine, job, chat.inflight)
            # the first event before answering 200: a refusal (full queue, queue timeout) is still an HTTP status
            first = await _named(sources, until_disconnect(request, first_event(events)))
            sse = ResponseStream(builder, chat.metrics, namespace, keep).sse(prepend(first, events))
            return ClosingStreamingResponse(sse, media_type="text/event-stream")
        work = generation.complete(chat.engine, job, chat.inflight)
        (result,) = await _named(sources, until_disconnect(request, work))
        chat.metrics.observe(result, namespace)
        chat.metrics.requests_ok += 1
        cut_with_calls = builder.incomplete(result) and bool(result.tool_calls)
        response = builder.whole(result, cut_with_calls and generation.ends_in_text(chat.engine, job, result))
        keep(response)
        return JSONResponse(response)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, key: ApiKey) -> Any:
        entry = store.get(key, response_id)
        if entry is None:
            raise _not_found(response_id)
        return JSONResponse(entry.response)

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(
        response_id: str,
        key: ApiKey,
        after: Annotated[str | None, Query(max_length=MAX_LABEL_CHARS)] = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        order: Literal["asc", "desc"] = "desc",
    ) -> Any:
        """The conversation the response answered (the chain's items, then its own input), OpenAI's list page."""
        entry = store.get(key, response_id)
        if entry is None:
            raise _not_found(response_id)
        items = [listed(item) for item in entry.items]
        items = items if order == "asc" else items[::-1]
        start = 0
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise APIError(400, f"after: no item {after!r} in this response's input", param="after")
            start = ids.index(after) + 1
        page = items[start : start + limit]
        return JSONResponse(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": start + limit < len(items),
            }
        )

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, key: ApiKey) -> Any:
        if not store.delete(key, response_id):
            raise _not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})
