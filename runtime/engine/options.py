"""RequestOptions: one request's options in one frozen object, as vLLM's SamplingParams is for its entry points.

Every entry point builds it, once per request (never per step): `generate`, `chat`, `submit`, `submit_group`,
`agenerate`, `achat`, `stream`, `fork` and sessions from their keyword arguments (`RequestOptions.of`), the server
from an OpenAI body, the replay from a trace's turn, the cluster's front door before it routes. How tokens are chosen
and when a request stops is the `sampling` part, a SamplingParams (runtime.engine.sampling) unchanged; the rest is
what the engine does with the request (cache namespace, priority, timeout, pins, retention, admission hint, the
trace's session id).

The keyword names are the fields of SamplingParams and of this class, written once, here and there; `params=` (a
whole SamplingParams) replaces the sampling keywords, so one given beside it (max_new_tokens too) is a ValueError
naming it, never dropped. What can be checked without the engine is checked in
`__post_init__`, with the messages the engine has always given; the engine adds what needs its model (stop strings
need a tokenizer, logit_bias ids within the vocabulary, a pin within the pinned share).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from radixcache.policy.admission import check_retain
from radixcache.runtime.engine.sampling import SamplingParams
from radixcache.runtime.grammar.errors import GrammarError
from radixcache.runtime.grammar.spec import GrammarSpec
from radixcache.runtime.kv.leases import check_retain_for
from radixcache.runtime.tools.errors import ToolInputError
from radixcache.runtime.tools.use import KEYWORDS as TOOL_KEYWORDS
from radixcache.runtime.tools.use import ToolUse


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """One request's options.

    sampling: how tokens are chosen and when generation stops (max_new_tokens, temperature, top_k, top_p, min_p,
    seed, stop, stop_token_ids, ignore_eos, the penalties, logit_bias, logprobs: SamplingParams documents each).
    namespace: the cache namespace (hashable; requests in different namespaces never share KV). return_logits: keep
    each step's logits in the result (tests). priority: higher is admitted first and preempted last. timeout:
    seconds, after which the request ends with finish_reason "timeout". pin: keep the prompt's KV (True) or its
    first n tokens' whole pages in the cache until `unpin`. pin_holder: who holds the pin (a string; None: the
    engine's caller at large): holders pinning the same prompt each hold their own share, and an `unpin` naming a
    holder releases only its share (each Session is one). retention: a soft priority for keeping the prompt's KV
    (runtime.kv.retention). retain: "conversation" makes the tree adopt every page whatever the admission policy
    predicts (None: no hint). session: the conversation the request belongs to (a recorded trace's `session_id`;
    behind replicas, what sticks it to one). retain_for: seconds to keep the request's pages (prompt and reply)
    locked in the cache after it ends, renewed by each request that hits them, expiring on their own
    (runtime.kv.leases; the result's `lease` says what was granted); None or 0: no lease.
    grammar: what the output must match (runtime.grammar.GrammarSpec: a JSON schema, any JSON object, a regex or an
    EBNF grammar; docs/structured_output.md), or None. The keyword `response_format=` (an OpenAI response_format
    dict) sets it through `GrammarSpec.from_response_format`. tool_use: the tools a chat may call
    (runtime.tools.ToolUse), set by the keywords `tools=`, `tool_choice=` and `parallel_tool_calls=`
    (docs/tool_calls.md), or None.
    """

    sampling: SamplingParams = field(default_factory=SamplingParams)
    namespace: Hashable = None
    return_logits: bool = False
    priority: int = 0
    timeout: float | None = None
    pin: bool | int = False
    pin_holder: str | None = None
    retention: int = 0
    retain: str | None = None
    session: str | None = None
    retain_for: float | None = None
    grammar: GrammarSpec | None = None
    tool_use: ToolUse | None = None

    def __post_init__(self) -> None:
        check_namespace(self.namespace)
        check_retain(self.retain)
        object.__setattr__(self, "retain_for", check_retain_for(self.retain_for))  # an int becomes seconds as float
        if not isinstance(self.sampling, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(self.sampling).__name__}")
        if self.timeout is not None:
            t = self.timeout
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
                raise ValueError(f"timeout must be > 0 seconds (a finite number), got {t!r}")
        if self.session is not None and not isinstance(self.session, str):  # behind replicas it keys the router
            raise ValueError(f"session must be a string or None, got {type(self.session).__name__}")
        if not isinstance(self.return_logits, bool):
            raise ValueError(f"return_logits must be True or False, got {self.return_logits!r}")
        for name in ("priority", "retention"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if not isinstance(self.pin, bool) and (not isinstance(self.pin, int) or self.pin < 0):
            raise ValueError(f"pin must be True, False or a number of tokens >= 0, got {self.pin!r}")
        if self.pin_holder is not None and not isinstance(self.pin_holder, str):
            raise ValueError(f"pin_holder must be a string or None, got {type(self.pin_holder).__name__}")
        if self.grammar is not None and not isinstance(self.grammar, GrammarSpec):
            raise ValueError(f"grammar must be a GrammarSpec or None, got {type(self.grammar).__name__}")
        if self.tool_use is not None and not isinstance(self.tool_use, ToolUse):
            raise ValueError(f"tool_use must be a ToolUse or None, got {type(self.tool_use).__name__}")

    @property
    def max_new_tokens(self) -> int:
        return self.sampling.max_new_tokens

    @classmethod
    def of(cls, max_new_tokens: int | None = None, *, caller: str = "Engine.generate", **kwargs: Any) -> RequestOptions:
        """Options from generate's keyword arguments: SamplingParams' fields and this class's (`params=`, a whole
        SamplingParams, holds the sampling ones, max_new_tokens included: one given beside it is a ValueError;
        max_new_tokens=None: 64, as generate's). An unknown keyword is a TypeError naming it and `caller`, as the
        method's own signature would say."""
        params, sampling, own = _split(caller, kwargs)
        if params is not None and max_new_tokens is not None:
            sampling["max_new_tokens"] = max_new_tokens
        _check_beside_params(caller, params, sampling)
        if params is None:
            params = SamplingParams(max_new_tokens=64 if max_new_tokens is None else max_new_tokens, **sampling)
        if "tools" in own:  # the tool keywords, gathered by _split
            own["tool_use"] = ToolUse.of(**own.pop("tools"))
        return cls(params, **own)

    def updated(self, *, caller: str = "RequestOptions.updated", **kwargs: Any) -> RequestOptions:
        """These options with some keyword arguments changed (say one branch's seed), checked again.
        A sampling keyword given as None (`max_new_tokens`, `temperature`, `stop`, ...) is "not given": these
        options' own value is kept, as a framework's own `temperature=None` passed through a session's turn or
        beside `options=` means "I set nothing here" (built from nothing, `SamplingParams`/`RequestOptions.of`,
        None is the field's default). To clear a value give the empty one: `stop=[]`, `logit_bias={}`."""
        if any(v is None and k in _SAMPLING for k, v in kwargs.items()):
            kwargs = {k: v for k, v in kwargs.items() if not (v is None and k in _SAMPLING)}
        if not kwargs:
            return self
        params, sampling, own = _split(caller, kwargs)
        _check_beside_params(caller, params, sampling)
        if params is None:
            params = dataclasses.replace(self.sampling, **sampling) if sampling else self.sampling
        if "tools" in own:  # the tool keywords change the tools in use (the ones not given are kept)
            tools = own.pop("tools")
            own["tool_use"] = self.tool_use.updated(**tools) if self.tool_use else ToolUse.of(**tools)
        return dataclasses.replace(self, sampling=params, **own)


def resolve_options(
    max_new_tokens: int | None, options: RequestOptions | None, kwargs: dict[str, Any], caller: str
) -> RequestOptions:
    """A call's options, the way every entry point takes them: `options` with `kwargs` over it (and
    `max_new_tokens` when given: None keeps the options' own), or built from `max_new_tokens` (None: 64) and
    `kwargs`. An unknown keyword is a TypeError naming `caller`, `caller` too (the options' label, not a keyword
    of a call: Python's own "got multiple values for keyword argument 'caller'" named RequestOptions.of)."""
    if "caller" in kwargs:
        raise TypeError(f"{caller}() got an unexpected keyword argument 'caller'")
    if options is None:
        return RequestOptions.of(max_new_tokens, caller=caller, **kwargs)
    if max_new_tokens is not None:  # given beside `options=`, it overrides its field as any keyword does
        kwargs = {"max_new_tokens": max_new_tokens, **kwargs}
    return checked_options(options).updated(caller=caller, **kwargs)


def checked_options(options: object) -> RequestOptions:
    """`options` if it is a RequestOptions, else a ValueError (a dict of keywords was an AttributeError, 'updated')."""
    if not isinstance(options, RequestOptions):
        raise ValueError(f"options must be a RequestOptions (RequestOptions.of(...)), got {type(options).__name__}")
    return options


def check_namespace(namespace: Hashable) -> None:
    """A namespace keys the cache's roots: refuse an unhashable one, or one unequal to itself (NaN: its nodes would
    fail the tree's invariant check, and no other request could ever match it), before anything is queued."""
    try:
        hash(namespace)
    except TypeError:
        raise ValueError(f"namespace must be hashable, got {type(namespace).__name__}") from None
    if namespace != namespace:
        raise ValueError(f"namespace must equal itself, got {namespace!r}")


# The most requests of one call's group (Engine.fork's branches, submit_group's prompts, and ClusterEngine's, which
# starts a thread per request): the n samples of one prompt, far past the server's n <= 16, but a typo such as
# fork("hi", 10**6) is refused rather than queueing a million requests. A batch of prompts (`submit`) has no bound.
MAX_GROUP = 1024


def check_group(count: int, what: str) -> None:
    """A ValueError naming `what` when one call would queue more than MAX_GROUP requests together."""
    if count > MAX_GROUP:
        raise ValueError(f"{what} queues at most {MAX_GROUP} requests together, got {count}")


_SAMPLING = frozenset(f.name for f in dataclasses.fields(SamplingParams))
_OWN = frozenset(f.name for f in dataclasses.fields(RequestOptions)) - {"sampling"}


def _split(caller: str, kwargs: dict[str, Any]) -> tuple[SamplingParams | None, dict[str, Any], dict[str, Any]]:
    """(params=, the sampling keywords, this class's keywords); TypeError on any other name."""
    params, sampling, own = None, {}, {}
    for name, value in kwargs.items():
        if name == "params":
            params = value
        elif name in TOOL_KEYWORDS:  # tools, tool_choice, parallel_tool_calls: one ToolUse (of / updated)
            own.setdefault("tools", {})[name] = value
        elif name == "response_format":  # OpenAI's form of `grammar` (None or {"type": "text"}: no constraint)
            own["response_format"] = None if value is None else GrammarSpec.from_response_format(value)
        elif name in _SAMPLING:
            sampling[name] = value
        elif name in _OWN:
            own[name] = value
        else:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")
    if "response_format" in own:  # one constraint: "none" beside `grammar=` keeps it, two are an error
        spec = own.pop("response_format")
        if spec is not None and own.get("grammar") is not None:
            raise ValueError("give at most one of grammar and response_format: each constrains the whole output")
        if spec is not None or "grammar" not in own:
            own["grammar"] = spec
    return params, sampling, own


def _check_beside_params(caller: str, params: object, sampling: dict[str, Any]) -> None:
    """`params=` is a whole SamplingParams: a sampling keyword beside it would be dropped, so it is refused by name
    (one given as None is "not given", as everywhere a sampling keyword's None sits over options that set it)."""
    given = sorted(name for name, value in sampling.items() if value is not None)
    if params is not None and given:
        names = ", ".join(given)
        raise ValueError(
            f"{caller}: {names} given beside params=, a whole SamplingParams that sets every sampling option: "
            "set them in the SamplingParams (dataclasses.replace), or give no params="
        )


def check_each(each: object, prompts: int) -> None:
    """submit_group's `each`: none (None or empty: no per-prompt overrides), or one dict of keyword arguments per
    prompt; else a ValueError saying which (a non-dict entry was a TypeError from inside `RequestOptions.updated`'s
    unpacking)."""
    if each is None:
        return
    if not isinstance(each, Sequence) or isinstance(each, (str, bytes)):
        raise ValueError(f"each must be a list of dicts of keyword arguments, got {type(each).__name__}")
    if each and len(each) != prompts:
        raise ValueError(f"each has {len(each)} entries for {prompts} prompts")
    bad = next((i for i, kw in enumerate(each) if not isinstance(kw, Mapping)), None)
    if bad is not None:
        raise ValueError(f"each[{bad}] must be a dict of keyword arguments, got {type(each[bad]).__name__}")


def each_options(
    options: RequestOptions, each: Sequence[Mapping[str, Any]] | None, caller: str
) -> list[RequestOptions]:
    """submit_group's per-prompt options: `options` with `each[i]` over it (`each` checked by check_each; none: []).
    An error names the entry, `each[i]`, and its field: Python's own ("got multiple values for keyword argument
    'caller'", "keywords must be strings") said neither."""
    if not each:
        return []
    out = []
    for i, kw in enumerate(each):
        bad = next((k for k in kw if not isinstance(k, str) or k == "caller"), None)
        if bad is not None:
            raise TypeError(f"each[{i}]: {caller}() got an unexpected keyword argument {bad!r}")
        try:
            out.append(options.updated(caller=caller, **kw))
        except (GrammarError, ToolInputError) as exc:  # their `path` names the field: the entry goes in front
            raise _at_entry(exc, f"each[{i}]") from exc
        except (ValueError, TypeError) as exc:
            if type(exc) not in (ValueError, TypeError):  # another subclass: its own constructor, left as it is
                raise
            raise type(exc)(f"each[{i}]: {exc}") from exc
    return out


def _at_entry(exc: GrammarError | ToolInputError, entry: str) -> ValueError:
    if isinstance(exc, GrammarError):
        return GrammarError(exc.reason, f"{entry}.{exc.path}")
    return ToolInputError(f"{entry}.{exc.path}", exc.problem)
