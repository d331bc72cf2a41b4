"""A streamed Responses answer: OpenAI's SSE events (`event: TYPE` and `data: {"type": TYPE, "sequence_number": n,
...}`), from the chat path's events (runtime.server.generation.stream).

    response.created, response.in_progress
    per message item: response.output_item.added, response.content_part.added, response.output_text.delta ...,
        response.output_text.done, response.content_part.done, response.output_item.done
    per call item: response.output_item.added, response.function_call_arguments.delta ...,
        response.function_call_arguments.done, response.output_item.done
    response.completed (or response.incomplete)

Items stream one after the other: an item is done when the next begins. With tools, the chat path's tool-call
deltas drive the items (`{"content"}` text, a call's first delta with its id and name, then its arguments), so the
items assemble to what the whole answer would hold. The final response's `output` is the items as streamed. A
failure once the stream has begun, building the last events and storing the response included, is an `error` event,
then response.failed. No `[DONE]`: OpenAI sends none here.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from radixcache.runtime.engine.request import GenerationResult
from radixcache.runtime.server.errors import api_error_for
from radixcache.runtime.server.responses_output import ResponseBuilder, arguments_closed, new_id


class ResponseStream:
    """The events of one response. `done(response, output)` runs once the response completed (to store it)."""

    def __init__(
        self,
        builder: ResponseBuilder,
        metrics: Any,
        namespace: Any,
        done: Callable[[dict[str, Any]], None] = lambda _: None,
    ) -> None:
        self.builder, self.metrics, self.namespace, self.done = builder, metrics, namespace, done
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.calls: dict[int, dict[str, Any]] = {}  # the parser's call index -> its item
        # an item's id -> the pieces of its text (a message) or arguments (a call) so far, joined when it closes:
        # putting each piece on the whole so far made a long answer's stream quadratic
        self.pieces: dict[str, list[str]] = {}

    def _event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self.items.index(item)}

    def _added(self, item: dict[str, Any]) -> list[str]:
        out = self._close("completed")
        self.items.append(item)
        self.open = item
        out.append(self._event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item)))
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(self._event("response.content_part.added", **self._where(item), content_index=0, part=part))
        return out

    def _text(self, text: str) -> list[str]:
        if not text:
            return []
        out: list[str] = []
        if self.open is None or self.open["type"] != "message":
            first = not any(i["type"] == "message" for i in self.items)
            msg_id = self.builder.message_id if first else new_id("msg")
            out += self._added({**self.builder.message("", "in_progress"), "id": msg_id, "content": []})
        item = self.open
        assert item is not None
        self.pieces.setdefault(item["id"], []).append(text)
        where = self._where(item)
        out.append(self._event("response.output_text.delta", **where, content_index=0, delta=text, logprobs=[]))
        return out

    def _call(self, delta: dict[str, Any]) -> list[str]:
        (tc,) = delta["tool_calls"]
        fn = tc.get("function", {})
        if "id" in tc:  # a call's first delta
            index = len(self.calls)
            item = self.builder.call(index, tc["id"], fn.get("name", ""), "", "in_progress")
            self.calls[tc["index"]] = item
            out = self._added(item)
            piece = fn.get("arguments", "")
        else:
            item, out, piece = self.calls[tc["index"]], [], fn.get("arguments", "")
        if piece:
            self.pieces.setdefault(item["id"], []).append(piece)
            out.append(self._event("response.function_call_arguments.delta", **self._where(item), delta=piece))
        return out

    def _close(self, status: str) -> list[str]:
        item, self.open = self.open, None
        if item is None:
            return []
        where = self._where(item)
        out = []
        if item["type"] == "message":
            text = "".join(self.pieces.pop(item["id"], ()))
            part = {"type": "output_text", "text": text, "annotations": []}
            out.append(self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]))
            out.append(self._event("response.content_part.done", **where, content_index=0, part=part))
            item["content"] = [part]
        else:
            self._join_arguments(item)
            out.append(self._event("response.function_call_arguments.done", **where, arguments=item["arguments"]))
        item["status"] = status
        out.append(self._event("response.output_item.done", output_index=where["output_index"], item=dict(item)))
        return out

    def _join_arguments(self, item: dict[str, Any]) -> None:
        """A call item's arguments: those it was made with and its pieces streamed since."""
        item["arguments"] += "".join(self.pieces.pop(item["id"], ()))

    async def sse(self, events: AsyncIterator[Any]) -> AsyncIterator[str]:
        b = self.builder
        yield self._event("response.created", response=b.response("in_progress"))
        yield self._event("response.in_progress", response=b.response("in_progress"))
        result: GenerationResult | None = None
        try:
            try:
                async for event in events:
                    for delta in event.deltas if event.deltas is not None else ({"content": event.text},):
                        call = "tool_calls" in delta
                        for line in self._call(delta) if call else self._text(delta.get("content") or ""):
                            yield line
                    if event.result is not None:
                        result = event.result
                        self.metrics.observe(result, self.namespace)
            finally:
                await events.aclose()  # type: ignore[attr-defined]
            if result is None:  # the chat path's stream ends with the result
                raise RuntimeError("the stream ended without its result")
            # the last events are built whole, the response stored, before any is sent: one that fails to build is
            # the error below, not a stream cut after the items (no error event, no response.failed)
            ending, response, status = self._ending(result)
        except Exception as exc:  # the headers are sent: the error travels in the stream, which still ends well
            error = api_error_for(exc)
            self.metrics.failed(error.status)
            yield self._event("error", code=error.code, message=error.message, param=error.param)
            failed = {"code": error.code or "server_error", "message": error.message}
            if self.open is not None and self.open["type"] == "function_call":  # its arguments so far
                self._join_arguments(self.open)
            yield self._event("response.failed", response=b.response("failed", self.items, error=failed))
            return
        for line in ending:
            yield line
        self.metrics.requests_ok += 1
        yield self._event(f"response.{status}", response=response)

    def _ending(self, result: GenerationResult) -> tuple[list[str], dict[str, Any], str]:
        """The events that close the last item (an empty reply's one empty message first), the final response
        (stored by `done`) and its status. Raising, it numbers none of them: the error event takes the next number
        (the items stay as closed here, whole)."""
        seq = self.seq
        try:
            return self._build_ending(result)
        except BaseException:
            self.seq = seq
            raise

    def _build_ending(self, result: GenerationResult) -> tuple[list[str], dict[str, Any], str]:
        b = self.builder
        status = "incomplete" if b.incomplete(result) else "completed"
        # an empty reply is one empty message, as the whole answer's
        out = [] if self.items else self._added({**b.message("", "in_progress"), "content": []})
        last, item_status = self.open, status
        if last is not None and last["type"] == "function_call":  # made once its arguments closed, cut after or not
            self._join_arguments(last)
            item_status = "completed" if arguments_closed(last["arguments"]) else "incomplete"
        out += self._close(item_status)
        response = b.response(status, self.items, b.usage(result))
        self.done(response)
        return out, response, status
