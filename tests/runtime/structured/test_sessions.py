"""Sessions as users drive them (tiny checkpoint: its real byte-level tokenizer and ChatML template): text that is
not valid Unicode and tool results that are not a mapping are clear errors that leave the session as it was, and a
save that fails leaves the earlier file whole."""

from __future__ import annotations

import asyncio
import copy
import re

import pytest

from radixcache.runtime import Engine
from tests.runtime.structured.test_tools import ONE_CALL, check_calls


@pytest.mark.parametrize("text", ["a\ud800b", "caf\udce9"])  # "\ud800" in JSON; Latin-1 read with surrogateescape
def test_a_lone_surrogate_is_a_value_error_and_the_session_goes_on(engine: Engine, text: str) -> None:
    """The tokenizer's backend raised TypeError('TextInputSequence must be str'), which `radixcache chat` showed as
    an internal error for a line of stdin that was not UTF-8."""
    lone = next(c for c in text if 0xD800 <= ord(c) <= 0xDFFF)
    s = engine.session(max_new_tokens=3, ignore_eos=True)
    with pytest.raises(ValueError, match=re.escape(f"not valid Unicode: it holds a lone surrogate {lone!r}")):
        s.send(text)
    with pytest.raises(ValueError, match="lone surrogate"):
        engine.generate(text, 2)
    assert s.messages == [] and s.send("hi").finish_reason == "length"


@pytest.mark.parametrize("results", ["5", None, [("call_1", "5")]])
def test_tool_results_that_are_not_a_mapping_are_a_value_error(engine: Engine, results: object) -> None:
    """A list of (id, text) pairs, a bare text or None failed with AttributeError ("'list' object has no attribute
    'items'"); the history is left as it was."""
    s = engine.session(max_new_tokens=2)
    with pytest.raises(ValueError, match="tool results must be a mapping of call ids to texts"):
        s.send_tool_results(results)  # type: ignore[arg-type]
    assert s.messages == []


def test_saving_a_history_that_is_not_valid_unicode_keeps_the_earlier_file(engine: Engine, tmp_path) -> None:
    """The JSON was encoded while being written: a message holding a lone surrogate raised UnicodeEncodeError after
    the file was opened, leaving an earlier save at that path truncated."""
    path = tmp_path / "s.json"
    engine.session(system="be brief.").save(path)
    before = path.read_bytes()
    with pytest.raises(UnicodeEncodeError):
        engine.session(messages=[{"role": "user", "content": "caf\udce9"}]).save(path)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("message", "path"),
    [
        ({"content": "no role"}, "messages[1].role"),
        ({"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": [1]}}]}, "arguments"),
        ({"role": "tool", "content": "5"}, "messages[1].tool_call_id"),
    ],
)
def test_a_damaged_saved_history_is_a_value_error_naming_the_message(engine: Engine, message, path: str) -> None:
    """A hand-edited or damaged file loaded (from_dict checked only that messages were objects), then `repr` of the
    session raised KeyError('role') and every turn failed on the message; it is refused when loaded, named."""
    from radixcache.runtime.engine.session import Session

    data = {"messages": [{"role": "user", "content": "hi"}, message], "defaults": {"max_new_tokens": 2}}
    with pytest.raises(ValueError, match=re.escape(path)):
        Session.from_dict(engine, data)
    good = Session.from_dict(engine, {"messages": data["messages"][:1]})
    assert repr(good) == "Session(turns=1, defaults={})" and good.send("again").finish_reason in ("stop", "length")


@pytest.mark.parametrize("key", ["engine", "messages", "caller"])
def test_saved_defaults_holding_the_sessions_own_arguments_are_a_value_error(engine: Engine, key: str) -> None:
    """A hand-edited file whose defaults held `engine`, `messages` or `caller` raised TypeError ("got multiple values
    for keyword argument"), not the ValueError naming what is malformed that `from_dict` promises."""
    from radixcache.runtime.engine.session import Session

    data = {"messages": [{"role": "user", "content": "hi"}], "defaults": {key: None, "max_new_tokens": 2}}
    with pytest.raises(ValueError, match=key):
        Session.from_dict(engine, data)
    with pytest.raises(ValueError, match="caller"):
        engine.session(caller="mine")


def test_editing_a_call_in_a_copied_session_leaves_the_original_alone(engine: Engine) -> None:
    """Session.copy (a branch) shared the nested parts of each message with the original: a call's arguments
    edited in the branch before running it (a human in the loop) changed the original's history too, and so what
    its next turn rendered. The messages a session starts from are its own."""
    import json

    from tests.runtime.structured.conftest import TOOLS

    s = engine.session(tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_new_tokens=200, seed=1)
    r = s.send("How warm is Oslo?")
    assert r.tool_calls, r
    before = json.dumps(s.messages)
    branch = s.copy()
    branch.messages[-1]["tool_calls"][0]["function"]["arguments"] = '{"edited": true}'
    assert json.dumps(s.messages) == before
    given = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    started = engine.session(messages=given)
    given[0]["content"][0]["text"] = "changed later"
    assert started.messages[0]["content"][0]["text"] == "hi"


@pytest.mark.parametrize(
    ("system", "problem"),
    [
        (3, "must be a string or a list of text parts, got int"),
        (b"be brief.", "must be a string or a list of text parts, got bytes"),
        (True, "must be a string or a list of text parts, got bool"),
        (["be brief."], "only text parts"),
    ],
)
def test_a_system_prompt_that_is_no_text_is_refused_when_the_session_is_made(
    engine: Engine, system: object, problem: str
) -> None:
    """session(system=3) was accepted, and only the first send failed (a ChatMessageError naming messages[0])."""
    with pytest.raises(ValueError, match=re.escape(f"session system prompt: {problem}")):
        engine.session(system=system)  # type: ignore[arg-type]
    assert engine.session(system="be brief.").messages == [{"role": "system", "content": "be brief."}]
    parts = [{"type": "text", "text": "be brief."}]  # OpenAI's text parts, as a message's content may be
    assert engine.session(system=parts).messages == [{"role": "system", "content": parts}]  # type: ignore[arg-type]


@pytest.mark.parametrize("results", [{}, {"call_nope": "5"}, {None: "5"}])
def test_tool_results_answering_no_call_of_the_last_reply_are_refused(engine: Engine, results: dict) -> None:
    """`send_tool_results({})` added no tool turn and generated a second assistant reply in a row, and a result for
    an id the last reply never called was rendered as an answer to it; both are refused, sync and async, naming the
    argument, and the history is left as it was. A result keyed None was taken for no stray at all, and refused as
    if the reply's call were left unanswered."""
    from tests.runtime.structured.test_tools import ONE_CALL

    s = engine.session(system="Use the tools.", **ONE_CALL, max_new_tokens=200, seed=1)
    r = s.send("What is 2 + 3?")
    assert r.tool_calls, r
    history = list(s.messages)
    what = "empty mapping" if not results else re.escape(f"{next(iter(results))!r} is not a call id of the last reply")
    with pytest.raises(ValueError, match=what):
        s.send_tool_results(results)
    with pytest.raises(ValueError, match=what):
        asyncio.run(s.asend_tool_results(results))
    assert s.messages == history and len(s.results) == 1
    s2 = engine.session(max_new_tokens=2)  # no reply yet: no call to answer
    with pytest.raises(ValueError, match="not a call id of the last reply"):
        s2.send_tool_results({"call_1": "5"})


def test_tool_results_leaving_a_call_of_the_last_reply_unanswered_are_refused(engine: Engine) -> None:
    """A reply that made two calls answered for one only was accepted: the model went on as if the other had run
    (the Responses API refuses it with a 400). A call cut short (its arguments unclosed) was not made: it needs no
    result."""
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "call_b", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}},
        {"id": "call_c", "type": "function", "function": {"name": "add", "arguments": '{"a": 1'}},
    ]
    ask = [{"role": "user", "content": "2 + 3 and 1 + 1?"}, {"role": "assistant", "content": None, "tool_calls": calls}]
    s = engine.session(messages=ask, max_new_tokens=2)
    with pytest.raises(ValueError, match="the last reply's call 'call_b' has no result"):
        s.send_tool_results({"call_a": "5"})
    assert s.messages == ask
    r = s.send_tool_results({"call_a": "5", "call_b": "2"})  # call_c was cut short: no result needed
    assert s.messages[-3:-1] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "5"},
        {"role": "tool", "tool_call_id": "call_b", "content": "2"},
    ]
    assert s.messages[-1] == {"role": "assistant", "content": r.text}


def test_a_user_turn_after_calls_left_without_results_is_refused(engine: Engine) -> None:
    """send (and asend) after a reply that made calls was accepted: the model read the user's turn as if the calls
    had run, while send_tool_results refused to leave one unanswered. It is a ValueError naming the calls, the
    history and the session's pin as they were; once the calls are answered the session goes on."""
    s = engine.session(system="Use the tools.", **ONE_CALL, pin=True, max_new_tokens=200, seed=1)
    r = s.send("What is 2 + 3?")
    check_calls(r)
    history, pinned = copy.deepcopy(s.messages), engine.stats.pinned_blocks
    assert pinned > 0 and len(engine.kv.pins) == 1
    ids = [c.id for c in r.tool_calls]
    with pytest.raises(ValueError, match=re.escape(f"the last reply's calls {ids} have no result")):
        s.send("And 1 + 1?")
    with pytest.raises(ValueError, match="have no result"):
        asyncio.run(s.asend("And 1 + 1?"))
    assert s.messages == history and len(s.results) == 1
    assert engine.stats.pinned_blocks == pinned and len(engine.kv.pins) == 1
    s.send_tool_results({i: "5" for i in ids}, tool_choice="none", max_new_tokens=2)
    assert s.send("And 1 + 1?", tool_choice="none", max_new_tokens=2).finish_reason == "length"
    assert s.unpin() == 1 and engine.stats.pinned_blocks == 0


def test_a_user_turn_after_a_call_cut_short_is_answered(engine: Engine) -> None:
    """A call the length limit cut (its arguments unclosed) was not made: it needs no result, as in
    send_tool_results; a result given to the other calls of a reply split one message per call counts."""
    add = {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    cut = {"id": "call_c", "type": "function", "function": {"name": "add", "arguments": '{"a": 1'}}
    ask = {"role": "user", "content": "2 + 3?"}
    s = engine.session(messages=[ask, {"role": "assistant", "content": None, "tool_calls": [cut]}], max_new_tokens=2)
    s.send("Go on.")
    split = [
        ask,
        {"role": "assistant", "content": None, "tool_calls": [add]},
        {"role": "assistant", "content": None, "tool_calls": [{**add, "id": "call_b"}]},
        {"role": "tool", "tool_call_id": "call_b", "content": "5"},
    ]
    s = engine.session(messages=split, max_new_tokens=2)
    with pytest.raises(ValueError, match=re.escape("the last reply's calls ['call_a'] have no result")):
        s.send("Go on.")
    s = engine.session(messages=[*split, {"role": "tool", "tool_call_id": "call_a", "content": "5"}], max_new_tokens=2)
    s.send("Go on.")


def test_a_fork_after_calls_left_without_results_is_refused(engine: Engine) -> None:
    """fork generated n replies right after a reply's calls, which the model read as if they had run: a ValueError
    as send's, the history and the session's pin unchanged; answered, the fork runs."""
    s = engine.session(system="Use the tools.", **ONE_CALL, pin=True, max_new_tokens=200, seed=1)
    r = s.send("What is 2 + 3?")
    check_calls(r)
    history, pinned = copy.deepcopy(s.messages), engine.stats.pinned_blocks
    ids = [c.id for c in r.tool_calls]
    with pytest.raises(ValueError, match=re.escape(f"the last reply's calls {ids} have no result")):
        s.fork(2, tool_choice="none", max_new_tokens=2, temperature=1.0)
    assert s.messages == history and engine.stats.pinned_blocks == pinned and len(engine.kv.pins) == 1
    s.send_tool_results({i: "5" for i in ids}, tool_choice="none", max_new_tokens=2)
    assert len(s.fork(2, tool_choice="none", max_new_tokens=2, temperature=1.0)) == 2
    assert s.unpin() == 1 and engine.stats.pinned_blocks == 0
