"""Token-for-token prefix stability of an agent loop (SGLang bug #16521): over three tool steps and a final
answer, encode(prompt_N) + the tokens the model emitted (its text and the end-of-turn token) is a prefix of
encode(prompt_N+1), for the tiny checkpoint's tokenizer and SmolLM2's (generic format), and for a Hermes-style
template that renders tools itself. The history is replayed as an OpenAI client does (ids, names, arguments, null
content); the ToolCallMemory restores the exact text when the model's JSON was not in canonical form, and the exact
token ids when the model emitted its text in a split the tokenizer would not make; without it such a turn is (as
expected) not a prefix."""

from __future__ import annotations

import json

import pytest

from radixcache.runtime.tools import ToolCallMemory, parse_tool_calls, template_features

# Emitted outputs per step: canonical (what the grammar's compact JSON writes) and free-form (odd whitespace).
CANONICAL = [
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}',
    '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]}',
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}]}',
]
FREEFORM = [
    '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}',
    '{ "tool_calls": [ {"name": "add", "arguments": {"a":1,"b":2}},\n {"name": "now", "arguments": {}} ] }',
    '{"tool_calls": [{"name": "get_weather",  "arguments": {"city": "Zürich", "unit": "celsius"}}]}',
]
HERMES_OUT = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>',
    'Adding.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
    '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}</tool_call>',
]
HERMES = (
    "{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "Tools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    'Answer calls as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n'
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls %}<tool_call>\n"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
RESULTS = ['{"temp": 21}', "3", "12:00", '{"temp": 5}']


def split_ids(tok, raw: str) -> list[int]:
    """A tokenization of `raw` that is not the canonical one: each run of 3 characters encoded alone (as a model
    under a grammar may emit `"` then `}}` where encoding the text gives `"}` then `}`)."""
    ids = [t for i in range(0, len(raw), 3) for t in tok.encode(raw[i : i + 3], add_special_tokens=False)]
    assert tok.decode(ids, skip_special_tokens=False) == raw
    return ids


def replayed(message: dict, results: list[dict], client: str) -> list[dict]:
    """A reply and its tool results as a client sends them back: "openai" as one assistant message, then the
    results; "split" one assistant message per call (the first with the content), then the results; "interleaved"
    each call's message followed by its result (Responses items as call, output, call, output)."""
    if client == "openai":
        return [message, *results]
    parts = [
        {"role": "assistant", "content": message["content"] if j == 0 else None, "tool_calls": [call]}
        for j, call in enumerate(message["tool_calls"])
    ]
    if client == "split":
        return [*parts, *results]
    return [m for pair in zip(parts, results, strict=True) for m in pair]


def agent_loop(
    tok,
    specs,
    outputs,
    *,
    memory,
    chat_template=None,
    system=True,
    noncanonical=False,
    tell_ids=True,
    client="openai",
):
    """Runs the loop; returns [(prompt ids, emitted ids)] per step and the final prompt ids. `noncanonical`: the
    model emits each call text as `split_ids` gives it, and the memory is told those ids if `tell_ids`; `client`:
    how the history replays each reply (`replayed`)."""
    fmt = template_features(chat_template or tok.chat_template).format
    history = [{"role": "system", "content": "You are terse."}] if system else []
    history.append({"role": "user", "content": "Weather in Paris, then 1+2 and the time, then Zürich?"})
    steps = []
    for n, raw in enumerate([*outputs, "Done: 21, 3, 12:00, 5."]):
        prompt = tok.encode(
            tok.apply_chat_template(history, tools=specs, tool_memory=memory, chat_template=chat_template)
        )
        text_ids = split_ids(tok, raw) if noncanonical else tok.encode(raw, add_special_tokens=False)
        emitted = [*text_ids, tok.eos_token_ids[0]]
        steps.append((prompt, emitted))
        parsed = parse_tool_calls(raw, specs, fmt)
        if n == len(outputs):
            assert not parsed.tool_calls
            break
        assert parsed.tool_calls, raw
        if memory is not None:
            memory.remember(parsed.tool_calls, parsed.raw, text_ids if noncanonical and tell_ids else ())
        message = json.loads(json.dumps(parsed.message()))  # what a client sends back
        results = [{"role": "tool", "tool_call_id": c.id, "content": RESULTS[n]} for c in parsed.tool_calls]
        history += replayed(message, results, client)
    return steps


def assert_each_step_extends_the_last(steps) -> None:
    for n in range(1, len(steps)):
        before = steps[n - 1][0] + steps[n - 1][1]
        assert steps[n][0][: len(before)] == before, f"step {n} does not extend step {n - 1}"
        assert len(steps[n][0]) > len(before)


@pytest.mark.parametrize("outputs", [CANONICAL, FREEFORM], ids=["canonical", "freeform"])
@pytest.mark.parametrize("system", [True, False])
def test_tiny_agent_loop_prompts_extend_each_other(tiny_tokenizer, specs, outputs, system) -> None:
    assert_each_step_extends_the_last(
        agent_loop(tiny_tokenizer, specs, outputs, memory=ToolCallMemory(), system=system)
    )


@pytest.mark.slow
@pytest.mark.parametrize("outputs", [CANONICAL, FREEFORM], ids=["canonical", "freeform"])
def test_smollm2_agent_loop_prompts_extend_each_other(smollm2_tokenizer, specs, outputs) -> None:
    assert_each_step_extends_the_last(agent_loop(smollm2_tokenizer, specs, outputs, memory=ToolCallMemory()))


@pytest.mark.slow
def test_smollm2_canonical_calls_need_no_memory(smollm2_tokenizer, specs) -> None:
    assert_each_step_extends_the_last(agent_loop(smollm2_tokenizer, specs, CANONICAL, memory=None))


def test_freeform_calls_without_memory_are_not_a_prefix(tiny_tokenizer, specs) -> None:
    """The control: re-rendering from the parsed call alone changes a free-form turn's tokens."""
    with pytest.raises(AssertionError, match="does not extend"):
        assert_each_step_extends_the_last(agent_loop(tiny_tokenizer, specs, FREEFORM, memory=None))


def test_hermes_template_agent_loop_prompts_extend_each_other(tiny_tokenizer, specs) -> None:
    assert template_features(HERMES).format == "hermes"
    steps = agent_loop(tiny_tokenizer, specs, HERMES_OUT, memory=ToolCallMemory(), chat_template=HERMES)
    assert_each_step_extends_the_last(steps)
    first = tiny_tokenizer.decode(steps[0][0], skip_special_tokens=False)
    assert '"name": "get_weather"' in first and "# Tools" not in first  # the template rendered the tools itself


@pytest.mark.parametrize("client", ["split", "interleaved"])
@pytest.mark.parametrize("template", [None, HERMES], ids=["generic", "hermes"])
def test_a_reply_whose_calls_come_back_one_message_each_is_rendered_as_that_reply(
    tiny_tokenizer, specs, client, template
) -> None:
    """A client that sends a reply's parallel calls back as one assistant message each (or Responses items as call,
    output, call, output, which the server turns into such messages) missed the memory, which knows the reply by all
    its ids: the calls re-rendered as separate turns and the next prompt no longer extended the cached one."""
    outputs, memory = HERMES_OUT if template else FREEFORM, ToolCallMemory()
    steps = agent_loop(
        tiny_tokenizer, specs, outputs, memory=memory, chat_template=template, noncanonical=True, client=client
    )
    assert_each_step_extends_the_last(steps)


@pytest.mark.parametrize("outputs", [CANONICAL, FREEFORM], ids=["canonical", "freeform"])
def test_calls_emitted_as_a_noncanonical_split_are_replayed_as_those_tokens(tiny_tokenizer, specs, outputs) -> None:
    steps = agent_loop(tiny_tokenizer, specs, outputs, memory=ToolCallMemory(), noncanonical=True)
    assert_each_step_extends_the_last(steps)


def test_smollm2_calls_emitted_as_a_noncanonical_split_are_replayed_as_those_tokens(smollm2_tokenizer, specs):
    # SmolLM2's tokenizer loads in well under a second (no weights): this runs in the quick path too.
    steps = agent_loop(smollm2_tokenizer, specs, CANONICAL, memory=ToolCallMemory(), noncanonical=True)
    assert_each_step_extends_the_last(steps)


def test_without_the_ids_a_noncanonical_split_is_not_a_prefix(smollm2_tokenizer, specs) -> None:
    tok = smollm2_tokenizer
    assert all(split_ids(tok, raw) != tok.encode(raw, add_special_tokens=False) for raw in CANONICAL)
    steps = agent_loop(tok, specs, CANONICAL, memory=ToolCallMemory(), noncanonical=True, tell_ids=False)
    with pytest.raises(AssertionError, match="does not extend"):
        assert_each_step_extends_the_last(steps)


def test_ids_that_do_not_decode_to_the_span_are_ignored(tiny_tokenizer) -> None:
    from radixcache.runtime.tools.known_tokens import KnownSpan, PromptText

    tok = tiny_tokenizer
    text = "hello tool world"
    wrong = PromptText(text, [KnownSpan(6, 10, tuple(tok.encode("nope", add_special_tokens=False)))])
    assert tok.encode(wrong) == tok.encode(text)
    right_ids = split_ids(tok, "tool")
    right = PromptText(text, [KnownSpan(6, 10, tuple(right_ids))])
    ids = tok.encode(right)
    assert tok.decode(ids, skip_special_tokens=False).endswith(text)
    assert right_ids == ids[len(tok.encode(text[:6])) :][: len(right_ids)]


# Replies the length limit cut after a call's name, before its arguments: the call has "" arguments, which a client
# replays as it got them (OpenAI's `""` for such a call; a history reads "" as no arguments, `{}`).
CUT_AFTER_NAME = [
    ('{"tool_calls": [{"name": "now"', None),
    ('{"tool_calls": [{"name": "now", "argu', None),
    ('Let me see.<tool_call>\n{"name": "now", "arguments": ', HERMES),
]


@pytest.mark.parametrize(("raw", "template"), CUT_AFTER_NAME, ids=["name", "argu", "hermes"])
@pytest.mark.parametrize("noncanonical", [False, True])
def test_a_call_cut_after_its_name_is_replayed_as_the_model_wrote_it(
    tiny_tokenizer, smollm2_tokenizer, specs, raw, template, noncanonical
) -> None:
    for tok in (tiny_tokenizer, smollm2_tokenizer):
        memory = ToolCallMemory()
        steps = agent_loop(tok, specs, [raw], memory=memory, chat_template=template, noncanonical=noncanonical)
        assert_each_step_extends_the_last(steps)
        text = tok.decode(steps[1][0], skip_special_tokens=False)
        assert raw + "<|im_end|>" in text  # what the model wrote, as it wrote it (not `"arguments": {}}]}`)


@pytest.mark.parametrize("where", ["user", "assistant"])
def test_a_remembered_call_is_spliced_where_the_call_is_not_at_an_earlier_copy_of_its_text(
    smollm2_tokenizer, specs, where
) -> None:
    """The emitted ids were placed at the first copy of the call's text in the prompt: a user who had pasted that
    call, or an earlier plain reply that said it, took the ids, so the earlier turn's tokens changed (the last prompt
    no longer a prefix) and the call itself was encoded from its text."""
    tok, raw = smollm2_tokenizer, CANONICAL[0]  # the tiny tokenizer's split of it is its canonical one
    earlier = {"role": where, "content": raw}
    history = [{"role": "user", "content": "Show me a call."}, earlier, {"role": "user", "content": "Now make it."}]
    memory = ToolCallMemory()
    prompt = tok.encode(tok.apply_chat_template(history, tools=specs, tool_memory=memory))
    emitted = split_ids(tok, raw)
    parsed = parse_tool_calls(raw, specs)
    memory.remember(parsed.tool_calls, parsed.raw, emitted)
    history.append(json.loads(json.dumps(parsed.message())))
    history.append({"role": "tool", "tool_call_id": parsed.tool_calls[0].id, "content": RESULTS[0]})
    after = tok.encode(tok.apply_chat_template(history, tools=specs, tool_memory=memory))
    assert_each_step_extends_the_last([(prompt, [*emitted, tok.eos_token_ids[0]]), (after, [])])


def test_place_known_finds_the_turn_itself_and_falls_back_to_the_search_when_a_template_changes_its_text() -> None:
    from radixcache.runtime.tools.known_tokens import KnownSpan, RememberedTurn, place_known

    def turn(content: str) -> RememberedTurn:
        t = RememberedTurn(role="assistant", content=content)
        t.token_ids = (7, 8)
        return t

    def plain(chat):
        return "".join(f"<{m['role']}>{m['content']}" for m in chat)

    chat = [{"role": "user", "content": "abc"}, turn("abc"), {"role": "user", "content": "abc"}]
    start = len("<user>abc<assistant>")
    assert place_known(plain(chat), chat, plain).known == (KnownSpan(start, start + 3, (7, 8)),)

    def trimmed(chat):  # prints a content otherwise than as given: the marks say nothing; the first copy is taken
        return "".join(f"<{m['role']}>{m['content'].strip()}" for m in chat)

    chat = [{"role": "user", "content": "abc"}, turn("abc ")]
    assert place_known(trimmed(chat), chat, trimmed) == "<user>abc<assistant>abc"
    assert not hasattr(place_known(trimmed(chat), chat, trimmed), "known")  # "abc " is in no place of the text
