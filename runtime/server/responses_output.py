"""The Responses API's response object, as the `openai` package types it (openai.types.responses.Response).

`ResponseBuilder` holds one response's ids (the response's, its message item's, each call item's), so the whole
answer and a stream's events name the same items. `output` is a message item (`output_text`, no annotations) when
the reply has text or no call, then a `function_call` item per call: its `call_id` is the engine's id of the call,
so a follow-up that answers it renders the very tokens the model wrote (runtime.tools.memory). A reply cut by
`max_output_tokens` (or the request's `timeout`, as chat says "length" for both) is `status: "incomplete"` with
`incomplete_details.reason` "max_output_tokens". `output_text` is not sent: the `openai` package computes it. The
request's settings are echoed as OpenAI echoes them (tools in their flat form, `text.format`, `tool_choice`, ...).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from radixcache.runtime.engine.request import GenerationResult
from radixcache.runtime.server.leases import lease_usage
from radixcache.runtime.server.responses_protocol import ResponsesRequest
from radixcache.runtime.tools.parse import json_object

INCOMPLETE = ("length", "timeout")  # finish reasons of a reply cut short


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def arguments_closed(arguments: str) -> bool:
    """Whether a call's arguments are whole (their object closed): a reply cut after them still made the call. A
    JSON object as the tool-call parser reads it: NaN is none (the chat path then finishes "stop")."""
    return json_object(arguments)


def _tool_echo(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "name": None, "description": None, "parameters": None, "strict": None, **tool}


class ResponseBuilder:
    def __init__(self, body: ResponsesRequest, model: str, prompt_tokens: int) -> None:
        self.body, self.model, self.prompt_tokens = body, model, prompt_tokens
        self.id = new_id("resp")
        self.message_id = new_id("msg")
        self._call_ids: dict[int, str] = {}
        self.created_at = int(time.time())

    def call_item_id(self, index: int) -> str:
        """The `fc_` id of the reply's call `index`."""
        return self._call_ids.setdefault(index, new_id("fc"))

    @staticmethod
    def incomplete(result: GenerationResult) -> bool:
        return result.finish_reason in INCOMPLETE

    def message(self, text: str, status: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": []}
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": [part]}

    def call(self, index: int, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
        return {
            "type": "function_call",
            "id": self.call_item_id(index),
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": status,
        }

    def output(self, result: GenerationResult, ends_in_text: bool = False) -> list[dict[str, Any]]:
        """The items; of a reply cut short only the item being written is incomplete, as streamed: the message when
        the reply has no call or wrote text after its calls (`ends_in_text`: that text is in the one message), else
        the last call while its arguments are open. A call whose arguments closed is complete, cut after it or not;
        one whose arguments a stop string cut is incomplete (no JSON to run) in a response that completed."""
        cut = self.incomplete(result)
        calls = result.tool_calls
        out = []
        if result.text or not calls:
            out.append(self.message(result.text, "incomplete" if cut and (ends_in_text or not calls) else "completed"))
        for i, c in enumerate(calls):
            open_ = i == len(calls) - 1 and not ends_in_text and not arguments_closed(c.arguments)
            out.append(self.call(i, c.id, c.name, c.arguments, "incomplete" if open_ else "completed"))
        return out

    def usage(self, result: GenerationResult) -> dict[str, Any]:
        output = len(result.token_ids)
        usage: dict[str, Any] = {
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": result.cached_tokens},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + output,
        }
        lease = lease_usage([result])
        if lease is not None:  # what `retain_for` got (runtime.server.leases)
            usage["lease"] = lease
        return usage

    def response(
        self,
        status: str,
        output: list[dict[str, Any]] | None = None,
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The response object in `status` (in_progress, completed, incomplete, failed)."""
        body = self.body
        fmt = body.text.format if body.text is not None else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": None,
            "model": self.model,
            "output": output or [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "prompt_cache_key": body.prompt_cache_key,
            "reasoning": {"effort": None, "summary": None},
            "safety_identifier": body.safety_identifier,
            "service_tier": "default",
            "store": body.stored,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {"format": fmt.echo() if fmt is not None else {"type": "text"}},
            "tool_choice": body.tool_choice or "auto",
            "tools": [_tool_echo(t) for t in body.tools or ()],
            "top_logprobs": 0,
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    def whole(self, result: GenerationResult, ends_in_text: bool = False) -> dict[str, Any]:
        status = "incomplete" if self.incomplete(result) else "completed"
        return self.response(status, self.output(result, ends_in_text), self.usage(result))
