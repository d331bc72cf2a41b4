"""The body of OpenAI's Responses API, `POST /v1/responses` (pydantic, strict, as runtime.server.protocol's chat body).

Every field is honoured or refused by name, unknown ones too ("Unrecognized request argument supplied: X"). The
`input` items are checked where they are translated (runtime.server.responses_input: a 400 naming `input.i.field`).

Honoured: `model`, `input`, `instructions`, `tools` (flat function tools), `tool_choice`, `parallel_tool_calls`,
`max_output_tokens`, `temperature`, `top_p`, `stream`, `text.format` (text, json_object, json_schema),
`previous_response_id`, `store`, `metadata`, `user`, `prompt_cache_key`, `safety_identifier`, `truncation`
"disabled"; and this server's own, as on chat: `cache_salt`, `timeout`, `seed`, `top_k`, `min_p`,
`presence_penalty`, `frequency_penalty`, `repetition_penalty`, `logit_bias`, `stop`, `retain`, `retain_for`.

Accepted because they change nothing here: `reasoning` without an effort or summary (the model does not reason:
an effort other than "none" is a 400, as OpenAI answers for a model that does not reason), `include`
["reasoning.encrypted_content"] (there are no reasoning items to include), `service_tier`,
`prompt_cache_retention` "in_memory", `stream_options.include_obfuscation` (no obfuscation is sent). Refused by
name: `truncation` "auto", `background` true, `conversation`, `prompt`, `max_tool_calls`, `top_logprobs`,
`context_management`, `text.verbosity`, a `prompt_cache_retention` of 24h.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from radixcache.runtime.kv.leases import MAX_RETAIN_FOR_S
from radixcache.runtime.server.protocol import (
    MAX_LABEL_CHARS,
    MAX_LOGIT_BIAS,
    MAX_MESSAGES,
    MAX_STOP,
    MAX_TIMEOUT_S,
    MAX_TOKENS,
    MAX_TOOLS,
    SEED_MAX,
    SEED_MIN,
    TOKEN_ID_MAX,
    APIError,
    Label,
    StopText,
    Text,
    _shallow,
    nulls_as_defaults,
)

# the chat body's fields these pass through unchanged (runtime.server.responses_input.chat_body)
PASSED = (
    "temperature",
    "top_p",
    "user",
    "prompt_cache_key",
    "safety_identifier",
    "metadata",
    "cache_salt",
    "timeout",
    "seed",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "stop",
    "retain",
    "retain_for",
    "parallel_tool_calls",
    "stream",
)

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class TextFormat(BaseModel):
    """`text.format`: what the output must be. `schema` is `json_schema` here (pydantic's own name)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True, populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: Label | None = None
    description: Text | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    _shallow_fields = field_validator("json_schema")(_shallow)

    def echo(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        out = {"type": "json_schema", "name": self.name, "schema": self.json_schema, "strict": self.strict}
        return {**out, "description": self.description} if self.description is not None else out


class TextConfig(BaseModel):
    model_config = _STRICT
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(BaseModel):
    model_config = _STRICT
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesStreamOptions(BaseModel):
    model_config = _STRICT
    include_obfuscation: bool | None = None


class ResponsesRequest(BaseModel):
    model_config = _STRICT
    model: Label
    input: Text | Annotated[list[dict[str, Any]], Field(max_length=MAX_MESSAGES)]
    instructions: Text | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    text: TextConfig | None = None
    previous_response_id: Label | None = None
    store: bool | None = None
    metadata: Annotated[dict[Label, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    user: Label | None = None
    prompt_cache_key: Label | None = None
    safety_identifier: Label | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: Reasoning | None = None
    include: Annotated[list[str], Field(max_length=16)] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    # OpenAI's, refused by name (refuse_unsupported)
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: Any = None
    top_logprobs: Any = None
    context_management: Any = None
    # this server's, as the chat endpoint has them (runtime.server.protocol)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_LABEL_CHARS)
    timeout: float | None = Field(default=None, gt=0.0, le=MAX_TIMEOUT_S)
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    top_k: int | None = Field(default=None, ge=0, le=TOKEN_ID_MAX)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, ge=0.01, le=2.0)
    logit_bias: Annotated[dict[str, float], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP)] | None = None
    retain: Literal["conversation"] | None = None
    retain_for: float | None = Field(default=None, ge=0.0, le=MAX_RETAIN_FOR_S)

    _shallow_fields = field_validator("input", "tools", "tool_choice")(_shallow)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:  # `stream: null`, as OpenAI takes it
        return nulls_as_defaults(cls, data)

    @property
    def stored(self) -> bool:
        return self.store is not False  # OpenAI's default: stored

    def refuse_unsupported(self) -> None:
        """Known fields this server cannot honour: a 400 naming each."""
        for name in ("conversation", "prompt", "max_tool_calls", "context_management"):
            if getattr(self, name) is not None:
                raise APIError(400, f"{name} is not supported by this server", param=name)
        if self.top_logprobs not in (None, 0):
            raise APIError(400, "top_logprobs is not supported on /v1/responses by this server", param="top_logprobs")
        if self.background:
            raise APIError(400, "background responses are not supported by this server", param="background")
        if self.truncation == "auto":
            raise APIError(
                400, 'truncation "auto" is not supported: a prompt past the context is refused', param="truncation"
            )
        if self.prompt_cache_retention == "24h":
            raise APIError(
                400, "prompt_cache_retention 24h is not supported (see retain_for)", param="prompt_cache_retention"
            )
        if self.text is not None and self.text.verbosity is not None:
            raise APIError(400, "text.verbosity is not supported by this model", param="text.verbosity")
        if self.reasoning is not None:
            for name in ("effort", "summary", "generate_summary"):
                if getattr(self.reasoning, name) not in (None, "none"):
                    raise APIError(400, f"reasoning.{name} is not supported with this model", param=f"reasoning.{name}")
        for i, item in enumerate(self.include or ()):
            if item != "reasoning.encrypted_content":
                raise APIError(400, f"include: {item!r} is not supported by this server", param=f"include.{i}")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options")
