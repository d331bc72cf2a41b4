"""Request rules a client meets through the openai package against the shared tiny server: a message's `content: []`
(no parts) is what `content: null` is, a 400 naming `messages.i.content` on a user, system, developer or tool
message (OpenAI answers an empty array with a 400) and no content on an assistant message, calls or not; and
`max_tokens` beside a different `max_completion_tokens` is a 400 naming both, as OpenAI answers both at once."""

from __future__ import annotations

import openai
import pytest

CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}


def _chat(client, messages, **kw):
    return client.chat.completions.create(model="tiny", messages=messages, temperature=0, **kw)


@pytest.mark.parametrize("role", ["user", "system", "developer"])
def test_an_empty_part_list_is_a_400_naming_the_content(client, role: str) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": role, "content": []}]
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, messages, max_tokens=2)
    assert info.value.body["param"] == "messages.1.content"
    assert "empty" in info.value.body["message"]


def test_an_empty_part_list_on_a_tool_message_is_a_400_as_null_is(client) -> None:
    messages = [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": []},
    ]
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, messages, max_tokens=2)
    assert info.value.body["param"] == "messages.2.content"


@pytest.mark.parametrize("calls", [[CALL], None])
def test_an_empty_part_list_on_an_assistant_message_answers_as_null_does(client, calls) -> None:
    def history(content):
        turn = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
        answer = (
            {"role": "tool", "tool_call_id": "call_1", "content": "2"} if calls else {"role": "user", "content": "?"}
        )
        return [{"role": "user", "content": "add one"}, turn, answer]

    null, empty = (_chat(client, history(c), max_tokens=6, logprobs=True) for c in (None, []))
    assert empty.usage.prompt_tokens == null.usage.prompt_tokens
    assert empty.choices[0].message.content == null.choices[0].message.content
    tokens = [[t.token for t in r.choices[0].logprobs.content] for r in (null, empty)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == empty.usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_and_max_completion_tokens_that_differ_are_a_400_naming_both(client, stream: bool) -> None:
    """OpenAI answers "Setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported." (400,
    invalid_parameter_combination); max_completion_tokens silently won here, so a client whose framework mirrored a
    stale max_tokens beside it got a reply length it never checked."""
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, [{"role": "user", "content": "hi"}], max_tokens=2, max_completion_tokens=6, stream=stream)
    body = info.value.body
    assert body["param"] == "max_tokens" and body["code"] == "invalid_parameter_combination"
    assert "'max_tokens'" in body["message"] and "'max_completion_tokens'" in body["message"]


def test_equal_max_tokens_and_max_completion_tokens_ask_one_limit(client) -> None:
    messages = [{"role": "user", "content": "count for me"}]
    both = _chat(client, messages, max_tokens=5, max_completion_tokens=5, logprobs=True)
    alone = _chat(client, messages, max_completion_tokens=5, logprobs=True)
    legacy = _chat(client, messages, max_tokens=5, logprobs=True)
    assert both.usage.completion_tokens == alone.usage.completion_tokens == legacy.usage.completion_tokens == 5
    assert both.choices[0].message.content == alone.choices[0].message.content == legacy.choices[0].message.content
    nulled = _chat(client, messages, max_tokens=None, max_completion_tokens=5)  # null is absent, never a conflict
    assert nulled.choices[0].message.content == alone.choices[0].message.content
