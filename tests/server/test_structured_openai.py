"""Structured output over HTTP with the real `openai` package, on the tiny checkpoint: `response_format`
json_schema (strict) and json_object, and this server's `regex` and `grammar` (GBNF, Lark) through extra_body, on
chat and the legacy completions; every reply validates (jsonschema, re.fullmatch), whatever the random model
prefers; streamed replies concatenate to the whole one at temperature 0; the constraint composes with n, stop,
logprobs and seeds; bad schemas and grammars are 400s naming their path."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import pytest

from tests.tiny_tools import SCHEMAS, closed, response_format

pytestmark = pytest.mark.xdist_group("tiny_tools_server")  # the shared server (conftest.py)


def _chat(tools_client, text: str, **kw: Any) -> Any:
    kw = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 120, **kw}
    return tools_client.chat.completions.create(**kw)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_replies_validate_over_temperatures_and_seeds(tools_client, name: str) -> None:
    for temperature, seed in ((0.0, None), (0.7, 1), (1.0, 2), (1.5, 3)):
        r = _chat(
            tools_client, f"describe {name}", response_format=response_format(name), temperature=temperature, seed=seed
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), closed(SCHEMAS[name]))


def test_json_object_replies_are_json_objects_and_n_samples_each_validate(tools_client) -> None:
    r = _chat(
        tools_client, "any object", response_format={"type": "json_object"}, n=3, temperature=1.0, seed=5, max_tokens=60
    )
    assert len(r.choices) == 3
    for choice in r.choices:  # a random model writes keys without end: a sample cut at the length is not JSON yet
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
    r = _chat(tools_client, "n samples", response_format=response_format("flags"), n=4, temperature=1.0, seed=9)
    for choice in r.choices:
        jsonschema.validate(json.loads(choice.message.content), closed(SCHEMAS["flags"]))


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        ({"regex": r"(yes|no), [0-9]{1,3}"}, r"(yes|no), [0-9]{1,3}"),
        ({"grammar": 'root ::= "ok " [a-c] [a-c]? ("!" | ".")'}, r"ok [a-c][a-c]?[!.]"),  # GBNF
        ({"grammar": 'start: "id-" DIGIT DIGIT\n%import common.DIGIT'}, r"id-[0-9][0-9]"),  # Lark
    ],
    ids=["regex", "gbnf", "lark"],
)
def test_regex_and_grammar_through_extra_body_on_both_endpoints(tools_client, extra: dict, pattern: str) -> None:
    for seed in range(3):
        r = _chat(tools_client, "answer", extra_body=extra, temperature=1.0, seed=seed)
        assert re.fullmatch(pattern, r.choices[0].message.content), r.choices[0].message.content
        c = tools_client.completions.create(
            model="tiny", prompt="The answer:", max_tokens=40, temperature=1.0, seed=seed, extra_body=extra
        )
        assert re.fullmatch(pattern, c.choices[0].text) and c.choices[0].finish_reason == "stop", c.choices[0]


def test_completions_take_response_format_for_raw_prompts(tools_client) -> None:
    c = tools_client.completions.create(
        model="tiny",
        prompt=["JSON please:", "Another:"],
        max_tokens=120,
        temperature=0.8,
        seed=4,
        extra_body={"response_format": response_format("nested")},
    )
    assert len(c.choices) == 2
    for choice in c.choices:
        jsonschema.validate(json.loads(choice.text), closed(SCHEMAS["nested"]))


def test_a_stream_concatenates_to_the_whole_reply_with_logprobs(tools_client) -> None:
    kw = {"response_format": response_format("choice"), "temperature": 0, "logprobs": True, "top_logprobs": 2}
    whole = _chat(tools_client, "stream it", **kw)
    chunks = list(_chat(tools_client, "stream it", stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    jsonschema.validate(json.loads(text), closed(SCHEMAS["choice"]))
    streamed = [lp.token for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert streamed == [lp.token for lp in whole.choices[0].logprobs.content]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


@pytest.mark.parametrize(
    ("regex", "stop", "want"),
    [
        ("abc,def,ghi", ",g", "abc,def,ghi"),  # "abc,def" is no sentence: it was cut there, with finish "stop"
        ("abc(,def)?", ",d", "abc"),  # "abc" is one (EOS biased away: the model must go on)
        (r'\{"a": "x,[a-z]{4}"\}', ",", None),  # a JSON-like sentence is complete only at its end
    ],
)
def test_a_stop_string_ends_a_constrained_reply_only_where_it_is_complete(
    tools_client, regex: str, stop: str, want: str | None
) -> None:
    kw: dict[str, Any] = {"extra_body": {"regex": regex}, "stop": [stop], "temperature": 1.0, "seed": 5}
    kw["logit_bias"] = {"256": -100}
    r = _chat(tools_client, "stop", **kw)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and re.fullmatch(regex, text), text
    assert want is None or text == want
    chunks = list(_chat(tools_client, "stop", stream=True, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text


def test_the_same_seed_gives_the_same_constrained_reply(tools_client) -> None:
    kw = {"response_format": response_format("nested"), "temperature": 1.0, "seed": 77}
    assert (
        _chat(tools_client, "seeded", **kw).choices[0].message.content
        == _chat(tools_client, "seeded", **kw).choices[0].message.content
    )


BAD = [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}},
        "response_format.json_schema.strict",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}},
            }
        },
        "response_format.json_schema.schema.properties.a.type",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "required": "a"}},
            }
        },
        "response_format.json_schema.schema.required",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"properties": {"p": {"pattern": "(("}}}},
            }
        },
        "response_format.json_schema.schema.properties.p.pattern",
    ),
    ({"response_format": "json"}, "response_format"),
    ({"regex": "(unclosed"}, "regex"),
    ({"regex": 5}, "regex"),
    ({"grammar": "root ::= missing_rule"}, "grammar"),
    ({"grammar": ""}, "grammar"),
    ({"regex": "a+", "grammar": 'root ::= "a"'}, "grammar"),
    ({"response_format": {"type": "json_object"}, "regex": "a+"}, "regex"),
]


@pytest.mark.parametrize(("body", "param"), BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bad_constraints_are_400_naming_the_path_and_a_bystander_is_served(
    tiny_tools_server, body, param, endpoint
) -> None:
    if endpoint == "chat":
        path, base = "/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
    else:
        path, base = "/completions", {"prompt": "hi"}
    for stream in (False, True):
        r = httpx.post(
            tiny_tools_server.v1 + path,
            json={"model": "tiny", "max_tokens": 2, "stream": stream, **base, **body},
            timeout=60,
        )
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and error["message"], error
    ok = httpx.post(tiny_tools_server.v1 + path, json={"model": "tiny", "max_tokens": 2, **base}, timeout=60)
    assert ok.status_code == 200, ok.text
