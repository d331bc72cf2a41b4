"""The OpenAI request bodies the server accepts (pydantic), and OpenAI's error JSON.

Unknown fields are ignored, as OpenAI's SDKs and agent frameworks send many (`user`, `presence_penalty`, ...).
Fields that would change the answer in a way this server cannot honour (`logprobs`, `tools`, `echo`,
`best_of` > 1, `suffix`) are refused with 400 rather than silently dropped.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 16


class APIError(Exception):
    """An error the client sees as `{"error": {"message", "type", "param", "code"}}` with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The content as plain text: text parts joined; other part types are refused."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, f"unsupported content part type {part.get('type')!r}", param="messages")
            parts.append(part["text"])
        return "".join(parts)


class _Common(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="ignore")
    model: str
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    tools: list[Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def refuse_unsupported(self) -> None:
        if self.logprobs:
            raise APIError(400, "logprobs are not supported by this server", param="logprobs")
        if self.tools:
            raise APIError(400, "tools are not supported by this server", param="tools")


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(default=None, ge=0)

    def limit(self, default: int) -> int:
        for v in (self.max_completion_tokens, self.max_tokens):
            if v is not None:
                return v
        return default


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def limit(self, default: int) -> int:
        return 16 if self.max_tokens is None else self.max_tokens  # OpenAI's legacy default

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise APIError(400, "echo is not supported by this server", param="echo")
        if self.best_of not in (None, 1):
            raise APIError(400, "best_of is not supported by this server", param="best_of")
        if self.suffix:
            raise APIError(400, "suffix is not supported by this server", param="suffix")


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One readable line and the offending parameter from pydantic's (or FastAPI's) error list."""
    if not errors:
        return "invalid request", None
    err = errors[0]
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if err.get("type") == "json_invalid":
        return "We could not parse the JSON body of your request.", None
    msg = err.get("msg", "invalid value")
    return (f"{param}: {msg}" if param else msg), param
