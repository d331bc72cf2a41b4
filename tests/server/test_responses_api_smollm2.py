"""The Responses API on the real SmolLM2-135M-Instruct (the shared `smollm2_server`), with the `openai` package: a
text answer, and a next turn by `previous_response_id` whose prompt reads that answer from the cache; a tool round
trip (a `function_call`, its `function_call_output` sent alone with `previous_response_id`, a text answer that reads
the previous prompt and call from the cache); json_schema output that validates (the extended tier,
RADIXCACHE_EXTENDED=1); a stream whose deltas join to the
same text as the whole answer at temperature 0; `max_output_tokens` as an incomplete response; `store: false`
leaving nothing to continue from."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.server.test_tools_smollm2 import PERSON
from tests.smollm2_tools import TOOLS
from tests.tiny_tools import closed

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smollm2_server")]  # the shared server (conftest.py)
PAGE = 16
FLAT = [{"type": "function", **t["function"]} for t in TOOLS]
SCHEMAS = {t["name"]: closed(t["parameters"]) for t in FLAT}


@pytest.fixture(scope="module")
def client(smollm2_server):
    with openai.OpenAI(base_url=smollm2_server.v1, api_key="unused", max_retries=0, timeout=600) as c:
        yield c


def _ask(client, **kw: Any) -> Any:
    return client.responses.create(model="smollm2", temperature=0, **kw)


def test_a_text_answer_the_same_text_streamed_and_a_next_turn_that_reads_it_from_the_cache(client) -> None:
    kw = {"instructions": "Answer in one short sentence.", "input": "What is the capital of France?"}
    whole = _ask(client, max_output_tokens=40, **kw)
    assert whole.status == "completed" and whole.output_text.strip(), whole
    deltas = []
    with client.responses.stream(model="smollm2", temperature=0, max_output_tokens=40, **kw) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == whole.output_text
    follow = _ask(client, instructions=kw["instructions"], input="And of Italy?", previous_response_id=whole.id)
    seen = whole.usage.input_tokens + whole.usage.output_tokens  # the previous prompt and its text reply
    assert follow.usage.input_tokens > seen and follow.output_text.strip()
    assert follow.usage.input_tokens_details.cached_tokens >= (seen - 1) // PAGE * PAGE, (seen, follow.usage)


def test_a_tool_round_trip_by_previous_response_id_reads_the_cache(client) -> None:
    instructions = "You are an agent. Call tools, then answer from their results."
    first = _ask(
        client,
        instructions=instructions,
        input="What's the weather like in Paris?",
        tools=FLAT,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=160,
    )
    assert first.status == "completed" and [o.type for o in first.output] == ["function_call"], first.output
    (call,) = first.output
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    follow = _ask(
        client,
        instructions=instructions,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 21}'}],
        tools=FLAT,
        tool_choice="none",
        max_output_tokens=48,
    )
    assert follow.output_text.strip() and [o.type for o in follow.output] == ["message"]
    seen = first.usage.input_tokens + first.usage.output_tokens
    assert follow.usage.input_tokens_details.cached_tokens >= (seen - 1) // PAGE * PAGE > 0, follow.usage


# Extended tier (tests/conftest.py): the default run holds its property more cheaply. The Responses API's
# text.format as a json_schema whose output validates: test_responses_api.py's test_json_schema_output_validates on
# the tiny checkpoint (the same grammar binds its replies); SmolLM2's json_schema replies validate over HTTP in
# test_tools_smollm2.py's test_json_schema_replies_validate (33 of them). 2.0 s of the last full run.
@pytest.mark.extended
def test_json_schema_output_validates(client) -> None:
    for prompt in ("Describe a famous chemist.", "Invent a pirate.", "A retired astronaut."):
        fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
        r = _ask(client, input=prompt, text={"format": fmt}, max_output_tokens=160)
        assert r.status == "completed", r
        jsonschema.validate(json.loads(r.output_text), closed(PERSON))


def test_max_output_tokens_is_incomplete_and_store_false_keeps_nothing(client) -> None:
    r = _ask(client, input="Write a long poem about the sea.", max_output_tokens=5, store=False)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5
    with pytest.raises(openai.BadRequestError) as exc:
        _ask(client, input="Go on.", previous_response_id=r.id)
    assert exc.value.code == "previous_response_not_found"
