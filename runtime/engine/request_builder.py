"""From what a caller sends to a validated Request: prompts encoded, chat rendered, batches split, options checked
against the model.

`RequestBuilder.build(prompt, options)` raises ValueError before anything is queued: a prompt that is neither text nor
an ordered sequence of integer token ids (bools and floats are not ids, a set has no order), a text prompt without a
tokenizer, an empty prompt, one that leaves no room under the model's `max_position` (ContextLengthError, a ValueError
with its sizes; a text of more bytes than those tokens can hold is refused before it is tokenised:
runtime.loading.prompt_bound), a token id outside the vocabulary, stop strings without a tokenizer, a logit_bias or
stop_token_ids id outside the vocabulary, a pin past the pinned share of the pool, a grammar that does not compile
(GrammarError, naming the schema path). A prompt needing more pages than the whole pool is a RequestTooLargeError here,
so a batch with one is refused before any of it is queued (the scheduler's own check at `add` stays, for requests built
by hand). What needs no model (sampling ranges, namespace, retain, timeout, tools) RequestOptions checked already. A
request's grammar is compiled here, in the caller's thread, never on the engine loop (engine.structured).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence, Set
from numbers import Integral
from typing import Any

import torch

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.engine.errors import ContextLengthError, RequestTooLargeError
from radixcache.runtime.engine.options import RequestOptions, check_group
from radixcache.runtime.engine.request import Request
from radixcache.runtime.engine.sampling import MAX_SEED, Sampler
from radixcache.runtime.engine.structured import EngineGrammars
from radixcache.runtime.engine.tool_calls import request_grammar
from radixcache.runtime.loading.chat_template import ChatTemplateError
from radixcache.runtime.loading.prompt_bound import may_be_too_long, token_bytes_bound, too_long
from radixcache.runtime.tools import ToolCallMemory, tool_template_features
from radixcache.runtime.tools.call_tokens import special_markers
from radixcache.runtime.tools.errors import ToolInputError
from radixcache.runtime.tools.prompt import chat_prompt
from radixcache.runtime.tools.tool_turns import check_tool_turns
from radixcache.runtime.tools.use import CallIds, ToolUse

Prompt = str | Sequence[int]
Messages = Sequence[dict[str, Any]]
MaxNew = int | None  # an entry point's max_new_tokens: None keeps the `options=` own, else 64 (options.resolve_options)


class RequestBuilder:
    """Builds one engine's requests: its tokenizer (or None), model shape, page size, pinned share and device."""

    def __init__(
        self,
        tokenizer: Any,
        config: ModelConfig,
        page_size: int,
        max_pinned_blocks: int,
        device: torch.device,
        *,
        stop_token_ids: Sequence[int] = (),
        tool_memory: ToolCallMemory | None = None,
        capacity_blocks: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.capacity_blocks = capacity_blocks  # the whole pool, in pages (None: not checked here)
        self.config = config
        self.page_size = page_size
        self.max_pinned_blocks = max_pinned_blocks
        self.device = device
        self.grammars = EngineGrammars(tokenizer, config.vocab_size, stop_token_ids)
        self.tool_memory = tool_memory if tool_memory is not None else ToolCallMemory()
        self.tool_features = tool_template_features(tokenizer)  # of its "tool_use" template, where it has one
        self.call_markers = special_markers(tokenizer, self.tool_features.format)  # R7B's, written as its tokens
        # the tokenizer's longest token in bytes (None: no bound): once, at the first text that may not fit
        self._per_token = functools.cache(lambda: token_bytes_bound(tokenizer))

    def build(self, prompt: Prompt, options: RequestOptions, pin_for: Sequence[int] | None = None) -> Request:
        """A validated Request for `prompt` (text or ids) under `options`; ValueError before anything is queued.
        `pin_for`: the prompt its pin is made for, which `unpin` names (a fork's prefix; None: this prompt)."""
        t0 = time.perf_counter()
        params = options.sampling
        self.check_sampling(params.stop, params.logit_bias, params.stop_token_ids)
        ids = self.encode(prompt)
        self.check_fits(ids)
        pin_tokens = len(ids) if options.pin is True else int(options.pin)
        if pin_tokens and pin_tokens // self.page_size > self.max_pinned_blocks:
            raise ValueError(
                f"pinning {pin_tokens} tokens exceeds the pinned share of the pool ({self.max_pinned_blocks} pages)"
            )
        spec = request_grammar(options, self.tool_features, self.call_markers)
        # compiled here, off the loop
        grammar = None if spec is None else self.grammars.state(spec, options.namespace, params.stop_token_ids)
        use = options.tool_use
        timeout = options.timeout
        return Request(
            ids,
            params,
            Sampler(params, self.device),
            namespace=options.namespace,
            keep_logits=options.return_logits,
            t_arrival=t0,
            priority=options.priority,
            deadline=None if timeout is None else t0 + timeout,
            pin=pin_tokens,
            pin_for=None if pin_for is None or not pin_tokens else tuple(pin_for),  # a tuple's tuple: itself
            pin_holder=options.pin_holder,
            retention=options.retention,
            retain=options.retain,
            session=options.session,
            retain_for=options.retain_for,
            grammar=grammar,
            tool_use=use,
            call_ids=CallIds(length=self.tool_features.call_id_length)
            if use is not None and use.parses_calls
            else None,
        )

    def build_all(
        self, prompts: Sequence[Prompt], options: Sequence[RequestOptions], pin_for: Any = None, what: str = "prompts"
    ) -> list[Request]:
        """`build` for each prompt with its options, all before any is queued. An error of one of several prompts
        names it, `what[i]` (a batch's "prompt is empty" or "token id 1000 is outside the vocabulary" said not which;
        `what` empty: as it is)."""
        reqs = []
        for i, (prompt, opts) in enumerate(zip(prompts, options, strict=True)):
            try:
                reqs.append(self.build(prompt, opts, pin_for))
            except (ValueError, RequestTooLargeError) as exc:
                if len(prompts) > 1 and what and isinstance(exc, ContextLengthError):
                    raise exc.named(f"{what}[{i}]") from exc
                if len(prompts) == 1 or not what or type(exc) not in (ValueError, RequestTooLargeError):
                    raise  # a GrammarError names its own path; the options are the call's, not the prompt's
                raise type(exc)(f"{what}[{i}]: {exc}") from exc
        return reqs

    def check_fits(self, ids: Sequence[int]) -> None:
        """RequestTooLargeError (the scheduler's, word for word) for a prompt more pages than the whole pool."""
        cap = self.capacity_blocks
        need = -(-len(ids) // self.page_size)
        if cap is not None and need > cap:
            raise RequestTooLargeError(
                f"a prompt of {len(ids)} tokens needs {need} pages of {self.page_size} tokens, "
                f"but the whole KV pool holds {cap} pages"
            )

    def check_sampling(
        self, stop: Sequence[str], logit_bias: Sequence[tuple[int, float]], stop_token_ids: Sequence[int] = ()
    ) -> None:
        """What of a request's sampling needs this model: stop strings need a tokenizer; logit_bias ids (sorted)
        and stop_token_ids must be in the vocabulary (a stop id past it could never be sampled: never a stop)."""
        if stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        if stop_token_ids and (top := max(stop_token_ids)) >= self.config.vocab_size:
            raise ValueError(f"stop_token_ids id {top} is outside the vocabulary [0, {self.config.vocab_size})")
        if logit_bias and (top := logit_bias[-1][0]) >= self.config.vocab_size:  # sorted: largest last
            raise ValueError(f"logit_bias token id {top} is outside the vocabulary [0, {self.config.vocab_size})")

    def encode(self, prompt: Prompt) -> list[int]:
        """A prompt's ids: text through the tokenizer (special tokens as it adds them), ids checked."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass token ids instead")
            self.check_text_fits(prompt)
            ids = list(self.tokenizer.encode(prompt))
        else:
            ids = token_ids(prompt, "prompt")
        if not ids:
            raise ValueError("the prompt is empty")
        limit = self.config.max_position
        if len(ids) >= limit:
            raise ContextLengthError(
                f"prompt of {len(ids)} tokens leaves no room under the model's max_position {limit}", len(ids), limit
            )
        self.check_vocabulary(ids)
        return ids

    def encode_continuation(self, text_or_ids: Prompt, what: str = "continuation") -> list[int]:
        """A fork continuation's ids: text is encoded without special tokens, so no BOS lands mid-sequence. Errors
        name it as `what` (Engine.fork: `continuations[i]`)."""
        if isinstance(text_or_ids, str):
            if self.tokenizer is None:
                raise ValueError("a text continuation needs a tokenizer; pass token ids instead")
            self.check_text_fits(text_or_ids, what)
            try:
                ids = list(self.tokenizer.encode(text_or_ids, add_special_tokens=False))
            except TypeError:  # a tokenizer without the keyword: drop a leading BOS it added
                ids = list(self.tokenizer.encode(text_or_ids))
                bos = getattr(self.tokenizer, "bos_token_id", None)
                if ids[:1] == [bos]:
                    ids = ids[1:]
        else:
            ids = token_ids(text_or_ids, what)
        self.check_vocabulary(ids, what)
        return ids

    def check_text_fits(self, text: str, what: str = "prompt") -> None:
        """`check_text_fits` under this model's `max_position`, with its tokenizer's bound."""
        check_text_fits(text, self.config.max_position, self._per_token, what)

    def check_vocabulary(self, ids: Sequence[int], what: str = "") -> None:
        vocab = self.config.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"{what + ': ' if what else ''}token id {bad} is outside the vocabulary [0, {vocab})")

    def render_for(self, messages: Messages | Sequence[Messages], options: RequestOptions) -> Any:
        """`render` with the tools and cache namespace of `options`, each chat's tool turns checked first (what every
        entry point renders: Engine.chat, achat, fork, stream, unpin): a tool turn answering no call or one answered
        already, or a call left without a result, is a ToolTurnError naming `messages[i].field`
        (runtime.tools.tool_turns), as the server's 400; of a list of chats, `messages[c][i].field` (chat c)."""
        chats = [messages] if is_messages(messages) else messages if _is_sequence(messages) else []
        for c, chat in enumerate(chats):
            if is_messages(chat):
                with _naming_chat(c, len(chats)):
                    check_tool_turns(chat)
        return self.render(messages, options.tool_use, options.namespace)

    def render(
        self, messages: Messages | Sequence[Messages], tool_use: ToolUse | None = None, namespace: Hashable = None
    ) -> Any:
        """The chat template applied (with the assistant turn's start): one text, or a list for a list of chats.
        Agent histories (tool calls, tool results, names, the developer role) and `tool_use`'s tools are rendered by
        the tokenizer (runtime.tools.render), with the engine's memory of the calls the model wrote in `namespace`
        (the request's cache namespace), as the server and the cluster's front door render them
        (runtime.tools.prompt)."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer; this engine has none")
        if is_messages(messages):
            return chat_prompt(self.tokenizer, messages, tool_use, self.tool_memory, namespace)
        if not _is_sequence(messages) or not messages or not all(is_messages(m) for m in messages):
            raise ValueError(
                "chat takes messages (a non-empty list of dicts with role and content) or a list of conversations, "
                f"got {_shown(messages)}"
            )
        prompts = []
        for c, chat in enumerate(messages):
            with _naming_chat(c, len(messages)):
                prompts.append(chat_prompt(self.tokenizer, chat, tool_use, self.tool_memory, namespace))
        return prompts


def fork_count(n: Any, continuations: Any) -> int:
    """Engine.fork's branch count: `n` (4 when None), or one per continuation; a ValueError naming what is wrong (a
    text for the continuations, an n that is not a positive integer, disagrees with them, or exceeds MAX_GROUP)."""
    if continuations is not None:
        if isinstance(continuations, (str, bytes)) or not isinstance(continuations, Sequence):
            # a str is a Sequence too: its characters would each have made a branch
            raise ValueError(f"continuations must be a list of texts or token id lists, got {continuations!r:.60}")
        if n is not None and n != len(continuations):  # it was dropped: the caller's n meant something else
            raise ValueError(f"fork got n={n!r} and {len(continuations)} continuations: give one, or equal")
        n = len(continuations)
    n = 4 if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"fork needs n >= 1 (an integer), got {n!r}")
    check_group(n, "fork")
    return n


def check_fork_seed(seed: int | None, n: int) -> None:
    """Engine.fork's `seed`, already a valid seed (branch i samples with seed + i), checked before any branch is
    built: a ValueError naming both, not a refusal of seed + i's value that the caller never gave."""
    if seed is None:
        return
    if seed + n - 1 > MAX_SEED:
        raise ValueError(f"fork: seed {seed} + {n - 1} (one per branch) passes the largest seed {MAX_SEED}")


def group_prompts(prompts: Any) -> list[Any]:
    """submit_group's prompts as a list: any iterable of prompts, as `submit` takes (a generator had no len()); one
    prompt (a text's characters, one prompt's ids), None or a number is a ValueError saying what a group is."""
    one = isinstance(prompts, (str, torch.Tensor))
    if not one and not _is_sequence(prompts):
        split_batch(prompts)  # None, a number, a dict: a ValueError saying what a prompt is
    items = [] if one else list(prompts)
    if one or (items and split_batch(items)[1]):
        raise ValueError("submit_group takes a list of prompts, got one prompt: pass [prompt]")
    return items


def split_batch(prompt: Any) -> tuple[list[Any], bool]:
    """(prompts, single): a str or a sequence of ints is one prompt; a list of those is a batch. Anything else (a
    number, None, a dict) is a ValueError saying what a prompt is. A list that starts with an integer is one prompt
    whatever follows, so that `token_ids` names a bad token by its position ([5, 6, False] was a batch whose
    prompt 5 was refused)."""
    if isinstance(prompt, (str, torch.Tensor)):
        return [prompt], True
    if not _is_sequence(prompt):
        raise ValueError(f"a prompt must be text, token ids or a list of prompts, got {_shown(prompt)}")
    items = list(prompt)
    if not items or isinstance(items[0], Integral):  # a bool too: token_ids refuses it by position
        return [items], True
    return items, False


def token_ids(prompt: Any, what: str) -> list[int]:
    """`prompt` (a sequence of integer token ids, a 1-d tensor) as a list of ints; ValueError naming `what[i]` for an
    element that is not an integer (a bool, a float, None, a nested list), or for a prompt that is not a sequence."""
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.tolist()
    if not _is_sequence(prompt):
        article = "" if "[" in what else "a "  # "a prompt", but "continuations[1]"
        raise ValueError(f"{article}{what} must be text or a sequence of token ids, got {_shown(prompt)}")
    ids = []
    for i, t in enumerate(prompt):
        try:
            if isinstance(t, bool):
                raise TypeError
            ids.append(operator.index(t))  # ints, numpy integers, one-element integer tensors
        except TypeError:
            raise ValueError(f"{what}[{i}] must be a token id (an integer), got {_shown(t)}") from None
    return ids


@contextlib.contextmanager
def _naming_chat(c: int, chats: int) -> Iterator[None]:
    """An error of chat c of a list of several that names a message (`messages[2].role`) names the chat too,
    `messages[c][2].role`, as a batch's prompt errors say `prompts[i]`: it said not which of many chats was refused."""
    try:
        yield
    except ToolInputError as exc:
        if chats == 1 or not exc.path.startswith("messages["):
            raise  # a tool's or tool_choice's error is the call's, not one chat's
        raise type(exc)(f"messages[{c}]{exc.path.removeprefix('messages')}", exc.problem) from exc
    except ChatTemplateError as exc:  # the template's own refusal ("roles must alternate"): no path of its own
        if chats == 1:
            raise
        raise type(exc)(f"messages[{c}]: {exc}") from exc


def check_text_fits(text: str, limit: int, per_token: Callable[[], int | None], what: str = "prompt") -> None:
    """A ContextLengthError, before `text` is tokenised, when it has more bytes than `limit` tokens of at most
    `per_token()` bytes each can hold (runtime.loading.prompt_bound; `per_token` asked only for a text some bound may
    refuse): a tool result of megabytes held the GIL for seconds while it was tokenised (4 MB: 3 s, every stream of
    the engine stalled as long), only to be refused. The Engine's request builder and the replicas' front door."""
    bound = per_token() if may_be_too_long(text, limit) else None
    size = too_long(text, limit, bound)
    if size is not None:
        raise ContextLengthError(
            f"{what} of {size:,} bytes of text leaves no room under the model's max_position {limit}: its tokens hold "
            f"at most {bound} bytes each (refused before tokenising)",
            size,
            limit,
            "bytes",
        )


def _is_sequence(x: Any) -> bool:
    """An ordered iterable: a set ({30, 1, 2} iterates as 1, 2, 30) would reorder a prompt's tokens, or a batch's
    prompts and so its results, without a word."""
    return isinstance(x, Iterable) and not isinstance(x, (str, bytes, bytearray, Mapping, Set))


def _shown(x: Any) -> str:
    text = repr(x)
    return f"{type(x).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def is_messages(x: Any) -> bool:
    """A chat conversation: a non-empty sequence of dicts."""
    return not isinstance(x, str) and isinstance(x, Sequence) and bool(x) and isinstance(x[0], dict)
