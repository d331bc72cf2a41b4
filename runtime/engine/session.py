"""Session: a multi-turn chat that appends each reply to its history, so every turn hits the cache for the
conversation so far. Saved to and loaded from JSON."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
import os
import uuid
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from radixcache.runtime.atomic_file import write_bytes
from radixcache.runtime.engine.options import RequestOptions, checked_options, resolve_options
from radixcache.runtime.engine.request import GenerationResult
from radixcache.runtime.tools.messages import normalize_message, normalize_messages
from radixcache.runtime.tools.parse import json_object
from radixcache.runtime.weak import weak_method

if TYPE_CHECKING:
    from radixcache.runtime.engine.protocol import ChatEngine


class _Pin(NamedTuple):
    """A pin the session may hold: the pinning turn's prompt (messages) and options, and the ids its pin was made
    for once the turn's result named them (empty: release by the messages, rendered again)."""

    messages: list[dict[str, Any]]
    options: RequestOptions
    ids: tuple[int, ...] = ()

    def same_prompt(self, other: _Pin) -> bool:
        """Whether `other` names the very pin this one does (the engine keeps one pin per prompt, namespace and
        holder)."""
        same = self.ids == other.ids if self.ids and other.ids else self.messages == other.messages
        mine = self.options.namespace, self.options.pin_holder
        return same and mine == (other.options.namespace, other.options.pin_holder)


class Session:
    """`s = engine.session(system="You are terse."); s.send("hi").text`.

    `defaults` are generate's keyword arguments for every turn (max_new_tokens, temperature, namespace, ...,
    or `options=` a RequestOptions with keywords over it), built once into `options` (a bad one is refused here); a
    turn's own keywords (and `options=`, which replaces the session's) override them.
    Not for concurrent use of one session: its turns are sequential by nature (many sessions may run at once on
    one engine). A reply cut short (finish_reason "cancelled" by close(), "timeout") is kept in the history as the
    result's partial text, as chat UIs keep a stopped reply; `del s.messages[-2:]` drops the turn. Cancelling the
    task awaiting `asend` raises there: neither the turn nor a reply is kept.

    With `tools=` (in the defaults or a turn's keywords), a reply that calls tools is kept in the history as
    OpenAI's assistant message with `tool_calls` (content None when there is no text), every call as the result has
    it: one the length limit left unfinished too (its arguments cut short, or "" when cut after its name), as a
    client replaying the reply sends it, so the next prompt holds what the model wrote and extends the cached one;
    `send_tool_results({call_id: text})` (`asend_tool_results` for asyncio) adds the tool turns and generates the
    next reply; until the calls a reply made have their results, `send` is a ValueError naming them.

    With `pin=` (True or n tokens, in the defaults or a turn's keywords), the session holds one pin, its latest pinned
    turn's (or fork's): a turn whose pin is made releases the session's earlier ones (the history only grows, so its
    prompt begins with theirs), but one made for the same prompt (a fork again, a turn sent again after it failed),
    which is the very pin the engine keeps; a pinned turn whose prompt does not begin with an earlier pin's (`messages`
    trimmed or rewritten, as an agent framework cuts its context) releases that pin before it runs, so pages only the
    old history held neither crowd the turn out of a small pool nor take the pinned share. The session is the pin's
    holder (`pin_holder`, its own unless the options name one): another session (a `copy()` or `copy.copy`, one loaded
    from its save) pinning the same history holds its own share, and `unpin()` releases this session's only; a session
    dropped without `unpin()` (collected: a saved one let go, say) has its share released before the engine's next step
    (`Engine.unpin_later`, which never waits: a finalizer may run on any thread, the engine loop's included), unless its
    options name the holder, whose pins stay until that holder is unpinned. A pin is cut to the engine's pinned share
    (`max_pinned_fraction`): a history past it keeps its first share of pages pinned, and a turn whose pin is refused
    (other pins hold the share) keeps the earlier one. `unpin()`, or leaving `with engine.session(...) as s:`, releases
    it: the very pin made, named by the ids its result says it was made for (`pinned_for`), not by the history rendered
    again, which differs once the engine's tool memory has forgotten a call it replays.
    """

    def __init__(
        self,
        engine: ChatEngine,
        *,
        system: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        **defaults: Any,
    ) -> None:
        self.engine = engine
        self.messages: list[dict[str, Any]] = _history(messages)
        if system is not None:
            try:  # checked now, as the messages are: else only the first turn's render refused it
                normalize_message({"role": "system", "content": system}, 0)
            except ValueError as exc:
                raise ValueError(f"session system prompt: {getattr(exc, 'problem', exc)}") from None
            if self.messages and self.messages[0].get("role") == "system":
                raise ValueError("the messages already start with a system prompt")
            self.messages.insert(0, {"role": "system", "content": system})
        if "caller" in defaults:  # the options' own label (whose API built them), not a request default
            raise ValueError("caller is not a request option a session can default")
        self.defaults = defaults  # as given: what `to_dict` saves (a RequestOptions there is refused by `save`)
        rest = {k: v for k, v in defaults.items() if k != "options"}  # `options=`: built once, the rest over it
        base = defaults.get("options")
        caller = "Engine.session"
        if base is None:
            self.options = RequestOptions.of(caller=caller, **rest)
        else:
            self.options = checked_options(base).updated(caller=caller, **rest)
        self.results: list[GenerationResult] = []
        # the prompts (and options) of the turns whose pins the session may hold, oldest first: its latest pinned
        # turn's (as the ids its pin was made for, once its result named them), and any a turn that failed or was
        # cancelled after it was queued may have made (as its messages: no result named the ids)
        self._pins: list[_Pin] = []
        self._holder = uuid.uuid4().hex  # the holder of its pins (RequestOptions.pin_holder): this session alone
        self._on_collect: weakref.finalize | None = None  # releases the holder's pins once the session is collected

    def send(self, content: str, **kwargs: Any) -> GenerationResult:
        """Add a user turn, generate the reply, and append it to the history. A ValueError, the session unchanged,
        when the last reply made calls that have no result yet (`send_tool_results` answers them first)."""
        return self._turn(_user_turn(content, self.messages), kwargs, "Session.send")

    def send_tool_results(self, results: Mapping[str, str], **kwargs: Any) -> GenerationResult:
        """Add one tool turn per `{call_id: result text}` (in that order), generate the reply, and append it."""
        return self._turn(_tool_turns(results, self.messages), kwargs, "Session.send_tool_results")

    async def asend(self, content: str, **kwargs: Any) -> GenerationResult:
        """`send` for asyncio; cancelling the awaiting task keeps neither the turn nor a reply."""
        return await self._aturn(_user_turn(content, self.messages), kwargs, "Session.asend")

    async def asend_tool_results(self, results: Mapping[str, str], **kwargs: Any) -> GenerationResult:
        """`send_tool_results` for asyncio (an agent's loop on an event loop); as `asend`, cancelling the awaiting
        task keeps neither the tool turns nor a reply."""
        return await self._aturn(_tool_turns(results, self.messages), kwargs, "Session.asend_tool_results")

    def fork(self, n: int | None = None, **kwargs: Any) -> list[GenerationResult]:
        """n replies to the history so far (sharing its KV; Engine.fork's n and continuations); the history is
        unchanged. With `pin=`, its pin (of the history) becomes the session's, as a turn's does. A ValueError, as
        `send`'s, while the last reply's calls have no results."""
        _answered(self.messages, "a fork")  # its replies would follow calls without their results
        seed = kwargs.pop("seed", None)  # fork's own (branch i samples with seed + i); else the options' seed
        continuations = kwargs.pop("continuations", None)
        prompt = list(self.messages)
        options = self._asked(prompt, kwargs, "Session.fork")
        self._release(self._outgrown(prompt, options))
        results = self.engine.fork(prompt, n, continuations=continuations, seed=seed, options=options)
        self._release(self._replaced(options, max(results, key=lambda r: r.pinned_tokens)))
        return results

    def unpin(self) -> int:
        """Release the session's pin (and any a failed or cancelled turn may have left); how many pins
        (Engine.unpin's count)."""
        held, self._pins = self._pins, []
        return self._release(held)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        try:
            self.unpin()
        except Exception:
            if exc_type is None:
                raise
            # the block's own error stands: a release failing beside it (an engine that died, and with it its pins)
            # must not replace it

    def copy(self) -> Session:
        """The same history and defaults, holding pins of its own (none yet). `copy.copy` and `copy.deepcopy` give
        this too: a shallow copy shared this session's holder, so this one's collection released the copy's pins."""
        return Session(self.engine, messages=self.messages, **self.defaults)

    def __copy__(self) -> Session:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> Session:
        return self.copy()

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        return {"messages": self.messages, "defaults": self.defaults}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write `to_dict` as JSON; a default JSON cannot hold (a GrammarSpec, a callable) is a ValueError naming
        it, and a message that is not valid Unicode a UnicodeEncodeError, both raised before the file is opened. An
        earlier save at `path` is kept whole whatever fails (a full disk, a kill, a power cut): the file is replaced
        at once, synced to the disk first (radixcache.runtime.atomic_file), and a write error names `path`."""
        bad = next((k for k, v in self.defaults.items() if not _json_value(v)), None)
        if bad is not None:
            raise ValueError(f"session default {bad}={self.defaults[bad]!r} cannot be saved as JSON")
        data = json.dumps(self.to_dict(), ensure_ascii=False, indent=1).encode("utf-8")  # a lone surrogate fails here
        write_bytes(path, data)

    @classmethod
    def from_dict(cls, engine: ChatEngine, data: dict[str, Any]) -> Session:
        """A session from `to_dict`'s form; a ValueError naming what is malformed (a hand-edited or damaged file)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"session data must be an object with messages and defaults, got {type(data).__name__}")
        defaults = data.get("defaults") or {}
        if not isinstance(defaults, Mapping):
            raise ValueError(f"session defaults must be an object of keyword arguments, got {type(defaults).__name__}")
        taken = sorted({"engine", "messages"} & set(defaults))  # the session's own arguments, not request defaults
        if taken:
            raise ValueError(f"session defaults must not hold {', '.join(taken)} (the session's own, not a request's)")
        return cls(engine, messages=data.get("messages"), **defaults)

    @classmethod
    def load(cls, engine: ChatEngine, path: str | os.PathLike[str]) -> Session:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(engine, json.load(f))

    def __repr__(self) -> str:
        return f"Session(turns={sum(m['role'] == 'user' for m in self.messages)}, defaults={self.defaults})"

    # ------------------------------------------------------------------ private

    def _turn(self, turns: list[dict[str, Any]], kwargs: dict[str, Any], caller: str) -> GenerationResult:
        prompt = [*self.messages, *turns]
        options = self._asked(prompt, kwargs, caller)
        self._release(self._outgrown(prompt, options))
        result = self.engine.chat(prompt, options=options)
        self._release(self._replaced(options, result))
        return self._append(turns, result)

    async def _aturn(self, turns: list[dict[str, Any]], kwargs: dict[str, Any], caller: str) -> GenerationResult:
        prompt = [*self.messages, *turns]
        options = self._asked(prompt, kwargs, caller)
        stale = self._outgrown(prompt, options)
        if stale:  # Engine.unpin waits for the engine loop: off the event loop
            await asyncio.to_thread(self._release, stale)
        result = await self.engine.achat(prompt, options=options)
        earlier = self._replaced(options, result)
        if earlier:  # Engine.unpin waits for the engine loop: off the event loop
            await asyncio.to_thread(self._release, earlier)
        return self._append(turns, result)

    def _asked(self, prompt: list[dict[str, Any]], kwargs: dict[str, Any], caller: str) -> RequestOptions:
        """A turn's options: the session's (or the turn's own `options=`) with its keywords over them (an unknown one a
        TypeError naming `caller`, the method), its pin cut to the engine's pinned share (a pin past it was a
        ValueError at every turn once the history outgrew it); a turn asking a pin is noted as one the session may
        hold from now on (one that raises may have pinned: a request failed after its prompt was computed)."""
        given = kwargs.pop("options", None)
        options = resolve_options(None, self.options if given is None else given, kwargs, caller)
        share = getattr(self.engine, "max_pinned_blocks", None)
        if options.pin and share is not None:
            most = share * self.engine.cache.page_size  # type: ignore[attr-defined]
            options = options.updated(pin=most if options.pin is True else min(options.pin, most))
        if options.pin and options.pin_holder is None:
            options = options.updated(pin_holder=self._holder)
            self._unpin_when_collected()
        if options.pin:
            self._pins.append(_Pin([dict(m) for m in prompt], options))
        return options

    def _outgrown(self, prompt: list[dict[str, Any]], options: RequestOptions) -> list[_Pin]:
        """The session's pins that a pinned turn (or fork) of `prompt` no longer extends, taken out of its pins to be
        released before it runs: made for a history the caller has since trimmed or rewritten (an agent framework
        that cuts its context after a tool call), or under other tools or another namespace. Kept, they locked pages
        the new prompt does not share until its own pin was made, so a small pool could not fit the turn
        (CacheFullError), and they held the pinned share that its pin was then refused for. What the prompt still
        shares is matched again as it is admitted and pinned by its own pin."""
        if not options.pin:
            return []
        mine = _rendering(options)
        # the last is this turn's own, noted by `_asked`
        stale = [p for p in self._pins[:-1] if p.messages != prompt[: len(p.messages)] or _rendering(p.options) != mine]
        self._pins = [p for p in self._pins if not any(p is q for q in stale)]
        return stale

    def _replaced(self, options: RequestOptions, result: GenerationResult) -> list[_Pin]:
        """The session's pins a turn that asked one leaves to release: the earlier ones when its pin was made (noted
        by the ids it was made for, where the result names them); its own (none) when it was refused, the earlier
        kept."""
        if not options.pin:
            return []
        if not result.pinned_tokens:
            self._pins.pop()
            return []
        latest = self._pins[-1]
        if getattr(result, "pinned_for", ()):  # exact: a re-render may differ once the tool memory forgot a call
            latest = self._pins[-1] = latest._replace(ids=tuple(result.pinned_for))
        earlier, self._pins = self._pins[:-1], self._pins[-1:]
        # one of the same prompt is this very pin (a fork again, a turn retried after a cancel): releasing it would
        # release the pin just made
        return [pin for pin in earlier if not pin.same_prompt(latest)]

    def _unpin_when_collected(self) -> None:
        """Once the session is collected, its own holder's pins are released (an engine without `unpin_later`: a
        dropped session keeps them, as before). The finalizer holds the engine weakly and only posts the release to
        its loop: it never waits nor takes a lock, wherever the collection runs."""
        later = getattr(self.engine, "unpin_later", None)
        if self._on_collect is None and later is not None:
            call = weak_method(later) if inspect.ismethod(later) else later
            self._on_collect = weakref.finalize(self, call, self._holder)
            self._on_collect.atexit = False  # an engine at interpreter exit is closed, its pins gone with it

    def _release(self, pins: list[_Pin]) -> int:
        """Engine.unpin for each of `pins`: the ids a pin was made for, or the prompt as the pinning turn gave it,
        rendered the same way (a prompt that does not render, a turn refused for it, pinned nothing)."""
        released = 0
        for pin in pins:
            with contextlib.suppress(ValueError):
                released += self.engine.unpin(list(pin.ids) or pin.messages, options=pin.options)
        return released

    def _append(self, turns: list[dict[str, Any]], result: GenerationResult) -> GenerationResult:
        """Add the turns the reply answered (whatever their content, None included: the prompt had them) and the
        reply."""
        self.messages.extend(turns)
        calls = [c.to_openai() for c in result.tool_calls or ()]
        if calls:
            self.messages.append({"role": "assistant", "content": result.text or None, "tool_calls": calls})
        else:
            self.messages.append({"role": "assistant", "content": result.text})
        self.results.append(result)
        return result


def _rendering(options: RequestOptions) -> tuple[Any, ...]:
    """What besides the messages makes a turn's prompt tokens (the tools shown, the namespace whose memory of the
    calls renders them, and holds its pages): a pin made under other ones is no prefix of this turn's."""
    tools = options.tool_use.tools if options.tool_use is not None else ()
    return tools, options.namespace


def _tool_turns(results: object, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool messages of `{call_id: result text}`, in its order. A ValueError for anything but a mapping, for
    none (no tool turn: the reply would be a second assistant reply in a row), for an id that the history's last
    reply did not call (an answer to no call, which the model would read as one) and for a call of it left without
    a result (the model would go on as if it had run; one cut short, its arguments unclosed, was not made): the
    Responses API's 400s."""
    if not isinstance(results, Mapping):
        raise ValueError(f"tool results must be a mapping of call ids to texts, got {type(results).__name__}")
    if not results:
        raise ValueError("tool results must answer at least one call of the last reply, got an empty mapping")
    last = next((m for m in reversed(history) if m.get("role") == "assistant"), {})
    calls = [c for c in last.get("tool_calls") or () if isinstance(c, Mapping)]
    made = {c.get("id") for c in calls}
    strays = [call_id for call_id in results if call_id not in made]  # None too: no sentinel to read as "none"
    if strays:
        stray = strays[0]
        ids = sorted(made, key=str)
        raise ValueError(f"tool results: {stray!r} is not a call id of the last reply (its calls: {ids})")
    missing = next((c.get("id") for c in calls if _made(c) and c.get("id") not in results), None)
    if missing is not None:
        raise ValueError(f"tool results: the last reply's call {missing!r} has no result (each call it made needs one)")
    return [{"role": "tool", "tool_call_id": call_id, "content": text} for call_id, text in results.items()]


def _user_turn(content: str, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user message of `content`, after `_answered(history)`."""
    _answered(history, "the next user turn")
    return [{"role": "user", "content": content}]


def _answered(history: list[dict[str, Any]], before: str) -> None:
    """A ValueError when the history ends with calls made and left without a result (the model would read the next
    turn, or a fork's replies, as if they had run; OpenAI's chat API answers such a history 400)."""
    answered: set[Any] = set()
    for m in reversed(history):  # the history's last calls: its trailing assistant messages with calls and results
        if m.get("role") == "tool":
            answered.add(m.get("tool_call_id"))
        elif m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [c for c in m["tool_calls"] if isinstance(c, Mapping)]
            missing = [c.get("id") for c in calls if _made(c) and c.get("id") not in answered]
            if missing:
                raise ValueError(
                    f"the last reply's calls {missing} have no result: answer them with send_tool_results (each "
                    f"call it made needs one) before {before}"
                )
        else:
            break


def _made(call: Mapping[str, Any]) -> bool:
    """Whether a call of a reply was made: its arguments whole (an object), not cut short by the length limit."""
    arguments = (call.get("function") or {}).get("arguments", "")
    return isinstance(arguments, Mapping) or (isinstance(arguments, str) and json_object(arguments))


def _json_value(value: object) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _history(messages: object) -> list[dict[str, Any]]:
    """A deep copy of a session's starting history: a list of message objects (None: empty), else a ValueError."""
    if messages is None:
        return []
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"session messages must be a list of message objects, got {type(messages).__name__}")
    bad = next((i for i, m in enumerate(messages) if not isinstance(m, Mapping)), None)
    if bad is not None:
        raise ValueError(f"session messages[{bad}] must be a message object, got {type(messages[bad]).__name__}")
    history = [dict(m) for m in copy.deepcopy(list(messages))]  # its own: editing a copy's call edits no other
    normalize_messages(history)  # what every turn renders: a bad message is named now, not by each later turn
    return history
