"""tool_choice "auto" beside this server's `regex` and `grammar` fields, through the `openai` package on the tiny
checkpoint: each reply is calls that validate against their tools or content the constraint matches whole (the
constraint used to run alone, so no call could be written); a mistake in the constraint is a 400 naming its own
field, not `tools`."""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest

from tests.tiny_tools import TOOLS, check_calls

pytestmark = pytest.mark.xdist_group("tiny_tools_server")  # the shared server (conftest.py)

LANGUAGE = r"(yes|no), [ab]{1,2}"
CONSTRAINTS = {
    "regex": {"regex": LANGUAGE},
    "gbnf": {"grammar": 'root ::= ("yes" | "no") ", " [ab] [ab]?'},
    "lark": {"grammar": 'start: WORD ", " /[ab]{1,2}/\nWORD: "yes" | "no"'},
}
MESSAGES = [{"role": "system", "content": "Answer yes or no, or call a tool."}, {"role": "user", "content": "2 + 3?"}]


def _ask(tools_client: Any, extra: dict[str, Any], **kw: Any) -> Any:
    kw = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 200, **kw}
    return tools_client.chat.completions.create(**kw, extra_body=extra)


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_auto_beside_a_regex_or_grammar_answers_calls_or_matching_text(tools_client, kind: str) -> None:
    r = _ask(tools_client, CONSTRAINTS[kind], n=6, temperature=1.0, seed=3, parallel_tool_calls=False)
    for choice in r.choices:
        if choice.finish_reason == "length":  # the random model may run out inside a call's arguments
            continue
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            assert len(check_calls(choice.message.tool_calls)) == 1
        else:
            assert choice.finish_reason == "stop" and re.fullmatch(LANGUAGE, choice.message.content), choice


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_a_model_that_leans_to_a_call_calls_a_tool_beside_the_constraint(
    tools_client, tiny_model_dir, kind: str
) -> None:
    """A bias on `{`, which only a call may start with here: the call is written, and validates."""
    from radixcache.runtime.loading import load_config_and_tokenizer

    brace = load_config_and_tokenizer(str(tiny_model_dir))[1].encode("{", add_special_tokens=False)
    assert len(brace) == 1
    r = _ask(tools_client, CONSTRAINTS[kind], parallel_tool_calls=False, logit_bias={str(brace[0]): 100})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and len(check_calls(choice.message.tool_calls)) == 1, choice


@pytest.mark.parametrize(("extra", "param"), [({"regex": "a(b"}, "regex"), ({"grammar": "root ::= foo"}, "grammar")])
def test_a_bad_constraint_beside_tools_is_a_400_naming_it(tools_client, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(tools_client, extra, max_tokens=4)
    assert caught.value.body["param"] == param, caught.value.body
