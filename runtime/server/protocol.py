"""The OpenAI request bodies the server accepts (pydantic), and OpenAI's error JSON.

Every field is either honoured or refused: an unknown field is a 400 naming it ("Unrecognized request argument
supplied: X", as OpenAI says), and a known field this server cannot honour (`echo`, `best_of` > 1, `suffix`, ...)
is a 400 naming it too, never dropped silently. `user`, `metadata`, `stream_options.include_obfuscation` (no
obfuscation field is sent) and chat's `prompt_cache_retention` "in_memory" (the cache's own; "24h" is refused, as on
/v1/responses) are accepted: they label a request or change no answer.

Tools and structured output (runtime.server.structured turns them into the engine's ToolUse and GrammarSpec):
chat's `tools`, `tool_choice`, `parallel_tool_calls`; agent histories (`tool_calls` on assistant messages with
`content` null, `role: "tool"` with `tool_call_id`, `name` on any message, `developer` as the system message);
`response_format` (text, json_object, json_schema) on both endpoints, and this server's `regex` and `grammar`
(EBNF: GBNF or Lark) beside it, at most one of the three. OpenAI's deprecated `functions` / `function_call` (and
their history turns) are served as tools (runtime.server.legacy). A bad tool, schema or message is a 400 whose
`param` is its path (`tools.0.function.parameters.properties.x.type`).

Input is bounded here, by pydantic constraints, before anything reaches the engine: numbers finite (NaN and
Infinity refused everywhere) and in range, sizes, counts and JSON nesting bounded (MAX_* below), strings and lists
bounded in length. A violation is a 400 whose `param` is the field's path (runtime.server.validation_errors).

Beyond OpenAI's fields, as vLLM accepts them: `cache_salt` (a keyless caller's own cache namespace), `timeout`
(seconds; the request ends with what it generated), `top_k`, `min_p` and `repetition_penalty`. And this server's
own `retain`: "conversation" says the next turn of a live conversation will read this request's pages, so the
cache adopts all of them whatever its admission policy predicts (radixcache.policy.admission). And `retain_for`
(seconds): keep the request's pages in the cache that long after it ends, renewed by each request that hits them
(runtime.kv.leases; the per-tenant default and `usage.lease` are runtime.server.leases').
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from radixcache.runtime.grammar.schema_check import nests_deeper_than
from radixcache.runtime.kv.leases import MAX_RETAIN_FOR_S
from radixcache.runtime.server.body_parse import list_in_pieces

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
MAX_N = 16
MAX_CHOICES = 64  # prompts x n in one completions request
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as OpenAI
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions' logprobs, as OpenAI
MAX_TOKENS = 1 << 20  # max_tokens and max_completion_tokens (the context length bounds them further)
MAX_STOP = 4  # stop sequences, as OpenAI
MAX_STOP_CHARS = 256  # each stop string
MAX_MESSAGES = 4096  # messages of one chat request
MAX_TEXT_CHARS = 1 << 21  # one message's content, one prompt string, one text part
MAX_PROMPTS = 64  # prompts (or token ids lists) of one completions request
MAX_PROMPT_IDS = 1 << 20  # token ids of one prompt
MAX_LOGIT_BIAS = 300  # logit_bias entries, as OpenAI
MAX_LABEL_CHARS = 256  # user, cache_salt, metadata keys; metadata values 512 (OpenAI's)
MAX_TIMEOUT_S = 86_400.0
MAX_TOOLS = 128  # tools of one request, as OpenAI
MAX_TOOL_CALLS = 128  # tool calls of one assistant message
MAX_GRAMMAR_CHARS = 1 << 17  # a regex or an EBNF grammar
MAX_JSON_DEPTH = 64  # nesting of a free-form JSON field (a schema, a tool, a content part): see `_shallow`
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 63) - 1  # a 64-bit seed
TOKEN_ID_MAX = (1 << 31) - 1

Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
StopText = Annotated[str, Field(max_length=MAX_STOP_CHARS)]
TokenId = Annotated[int, Field(ge=0, le=TOKEN_ID_MAX)]
# validated in pieces: a body's million ids do not hold the GIL for one long call (runtime.server.body_parse)
TokenIds = Annotated[list[TokenId], Field(max_length=MAX_PROMPT_IDS), list_in_pieces(MAX_PROMPT_IDS)]
Label = Annotated[str, Field(max_length=MAX_LABEL_CHARS)]


class APIError(Exception):
    """An error the client sees as `{"error": {"message", "type", "param", "code"}}`, with `status` and `headers`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _shallow(value: Any) -> Any:
    """`value` if its JSON nests at most MAX_JSON_DEPTH containers deep: the walkers of schemas, tools and calls
    recurse per level, and a body nested hundreds deep would hit Python's recursion limit in the middle of a request
    (a RecursionError and no answer at all)."""
    if nests_deeper_than(value, MAX_JSON_DEPTH):
        raise ValueError(f"nests more than {MAX_JSON_DEPTH} levels of objects and arrays")
    return value


def nulls_as_defaults(model: type[BaseModel], data: Any) -> Any:
    """A body without the nulls of `model`'s fields whose default is not None. OpenAI's spec makes them nullable
    (`temperature`, `top_p`, `n`, the penalties, `stream`, `echo`: null is the default), and the openai package sends
    an argument given as None as null: such a request was a 400. A required field's null stays an error."""
    if not isinstance(data, dict):
        return data
    fields = model.model_fields

    def kept(name: str, value: Any) -> bool:
        field = fields.get(name)  # an unknown field's null stays, to be refused by name
        return value is not None or field is None or field.is_required() or field.default is None

    return {k: v for k, v in data.items() if kept(k, v)}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    include_usage: bool = False
    include_obfuscation: bool | None = None  # OpenAI's (the openai package types it): accepted, none is sent


class ChatMessage(BaseModel):
    """One message as OpenAI (and agent frameworks) send it: a role, content (text, text parts, or null or no parts
    on an assistant message that only calls tools), `name`, an assistant's `tool_calls`, a tool message's
    `tool_call_id`.
    What the roles allow is checked when the history is rendered (runtime.tools.messages: a 400 naming
    `messages.i.field`). A null value counts as absent; `refusal` null and `annotations` (citations of a reply,
    nothing the model reads) are accepted and dropped."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Text | Annotated[list[dict[str, Any]], Field(max_length=MAX_MESSAGES)] | None = None
    name: Label | None = None
    function_call: dict[str, Any] | None = None  # the deprecated form of one tool call (runtime.server.legacy)
    tool_calls: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOL_CALLS)] | None = None
    tool_call_id: Label | None = None
    refusal: None = None
    annotations: Annotated[list[Any], Field(max_length=MAX_MESSAGES)] | None = None

    _shallow_fields = field_validator("content", "function_call", "tool_calls", "annotations")(_shallow)

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k in ("role", "content")}
        return data

    def as_dict(self, index: int) -> dict[str, Any]:
        """The message for the chat template (runtime.tools.messages validates it): absent fields left out, text
        parts bounded like text."""
        if isinstance(self.content, list):
            for j, part in enumerate(self.content):
                if isinstance(part.get("text"), str) and len(part["text"]) > MAX_TEXT_CHARS:
                    raise APIError(
                        400,
                        f"a text part has more than {MAX_TEXT_CHARS} characters",
                        param=f"messages.{index}.content.{j}",
                    )
        out = self.model_dump(exclude_none=True, exclude={"refusal", "annotations"})
        out["content"] = self.content
        return out


class _Common(BaseModel):
    """Fields shared by both endpoints."""

    # NaN and Infinity are refused everywhere; and each field takes its own JSON type only, as OpenAI's API does:
    # pydantic's lax mode read max_tokens "5" as 5 and n true as 1, so a client's typo ran as something it never asked
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    model: Label
    max_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, le=TOKEN_ID_MAX)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, ge=0.01, le=2.0)
    logit_bias: Annotated[dict[str, float], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Label | None = None
    # OpenAI's key for grouping requests that share a prefix ("replaces the user field"): the session, ahead of `user`
    prompt_cache_key: Label | None = None
    safety_identifier: Label | None = None  # OpenAI's end-user label (what `user` was): accepted, changes nothing
    metadata: Annotated[dict[Label, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_LABEL_CHARS)
    timeout: float | None = Field(default=None, gt=0.0, le=MAX_TIMEOUT_S)
    retain: Literal["conversation"] | None = None
    retain_for: float | None = Field(default=None, ge=0.0, le=MAX_RETAIN_FOR_S, strict=True)  # not a bool, nor "30"
    response_format: dict[str, Any] | None = None
    regex: str | None = Field(default=None, max_length=MAX_GRAMMAR_CHARS)  # this server's: output matches it
    grammar: str | None = Field(default=None, max_length=MAX_GRAMMAR_CHARS)  # this server's: EBNF (GBNF or Lark)

    _shallow_fields = field_validator("response_format")(_shallow)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        return nulls_as_defaults(cls, data)

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for token, bias in (v or {}).items():
            if not (token.isascii() and token.isdigit()) or int(token) > TOKEN_ID_MAX:
                raise ValueError(f"keys must be token ids, got {token!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"biases must be in [-100, 100], got {bias} for token {token}")
        return v

    def stop_list(self) -> list[str]:
        """The stop strings; an empty one stops nothing, whether sent alone ("") or in a list ([""])."""
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [s for s in stops if s]

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def top_logprobs_count(self) -> int | None:
        """None: no logprobs; k: the chosen token's logprob and the k most likely."""
        raise NotImplementedError

    def sampling(self) -> dict[str, Any]:
        """The engine's sampling arguments for this body (runtime.engine.sampling.SamplingParams)."""
        kw: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "seed": self.seed,
        }
        if self.logit_bias:
            kw["logit_bias"] = {int(t): b for t, b in self.logit_bias.items()}
        if self.stop_list():
            kw["stop"] = self.stop_list()
        k = self.top_logprobs_count()
        if k is not None:
            kw["logprobs"] = k
        return kw

    def refuse_unsupported(self) -> None:
        """Fields this server knows but cannot honour, or that make no sense together: a 400 naming each."""
        if self.stream_options is not None and not self.stream:  # OpenAI refuses it too
            raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options")


class ChatCompletionRequest(_Common):
    messages: Annotated[list[ChatMessage], Field(max_length=MAX_MESSAGES)]
    max_completion_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = Field(default=None, strict=True)
    functions: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = None  # deprecated tools
    # OpenAI's fields that change no answer here: nothing is stored (store), one tier serves every request
    store: bool | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    modalities: Annotated[list[Literal["text"]], Field(max_length=1)] | None = None  # text out; audio is refused
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None  # the cache's own; "24h" is refused
    function_call: Literal["none", "auto"] | dict[str, Any] | None = None  # deprecated tool_choice

    _shallow_tools = field_validator("tools", "tool_choice", "functions", "function_call")(_shallow)

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.prompt_cache_retention == "24h":  # as /v1/responses refuses it
            raise APIError(
                400, "prompt_cache_retention 24h is not supported (see retain_for)", param="prompt_cache_retention"
            )
        both = (self.max_tokens, self.max_completion_tokens)
        if None not in both and both[0] != both[1]:  # OpenAI refuses both at once; equal values ask one thing
            raise APIError(
                400,
                f"Setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported: they differ "
                f"({both[0]} and {both[1]}); send max_completion_tokens only (max_tokens is deprecated)",
                param="max_tokens",
                code="invalid_parameter_combination",
            )

    def requested_tokens(self) -> int | None:
        """The completion length the caller asked for, if it did (both sent: equal, `refuse_unsupported`)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def limit(self, default: int) -> int:
        asked = self.requested_tokens()
        return default if asked is None else asked

    def top_logprobs_count(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs:
                raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
            return None
        return self.top_logprobs or 0


class CompletionRequest(_Common):
    prompt: (
        Text
        | TokenIds
        | Annotated[list[Text], Field(max_length=MAX_PROMPTS)]
        | Annotated[list[TokenIds], Field(max_length=MAX_PROMPTS)]
    )
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=0, le=MAX_N)
    suffix: Text | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, prompt: Any) -> Any:  # a field's check: its 400 names `prompt`
        if isinstance(prompt, list) and not prompt:
            raise ValueError("prompt must not be an empty list")
        return prompt

    def requested_tokens(self) -> int | None:
        return self.max_tokens

    def limit(self, default: int) -> int:
        return 16 if self.max_tokens is None else self.max_tokens  # OpenAI's legacy default

    def top_logprobs_count(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: one text, one token list, or a list of either."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise APIError(400, "echo is not supported by this server", param="echo")
        if self.best_of not in (None, 1):
            raise APIError(400, "best_of is not supported by this server", param="best_of")
        if self.suffix:
            raise APIError(400, "suffix is not supported by this server", param="suffix")
