"""Agent histories under Cohere's templates (tests/command_r_templates.py): assistant calls and tool results reach the
template as OpenAI's ids, names and arguments, which Command R7B's numbers from 0 across the history (each result
under its call's number, whatever order the results come in), the reply's text as `tool_plan`; an agent loop under
the Command-R / R+ template extends each prompt and output token for token (the memory restores the text the model
wrote); under R7B's, whose plain replies are wrapped in `<|START_RESPONSE|>`, a remembered call is never replayed as
such a reply: it renders through the template's own syntax, and where the memory knows the ids the model emitted,
they take the place of what the template printed for that reply, so R7B's loop extends each prompt too."""

from __future__ import annotations

import json

import pytest

from radixcache.runtime.tools import ToolCallMemory, parse_tool_calls, template_features
from tests.command_r_templates import COMMAND_R, COMMAND_R7B
from tests.runtime.tools.test_prefix import agent_loop, assert_each_step_extends_the_last

R_OUT = [
    'Action: ```json\n[{"tool_name": "get_weather", "parameters": {"city":"Paris"}}]\n```',
    'Two at once.\nAction: ```json\n[\n  {"tool_name": "add", "parameters": {"a": 1, "b": 2}},\n'
    '  {"tool_name": "now", "parameters": {}}\n]\n```',
    'Action: [{"parameters": {"city": "Zürich", "unit": "celsius"}, "tool_name": "get_weather"}]',
]

R7B_OUT = [
    '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city":"Paris"}}]<|END_ACTION|>',
    'Two at once.<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "add", "parameters": {"a": 1, "b": 2}}, '
    '{"tool_call_id": "1", "tool_name": "now", "parameters": {}}]<|END_ACTION|>',
    '<|START_ACTION|>[{"tool_call_id": "3", "tool_name": "get_weather", "parameters": {"city": "Zürich", '
    '"unit": "celsius"}}]<|END_ACTION|>',
]


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_r7b_numbers_the_calls_and_files_each_result_under_its_call(tiny_tokenizer, specs) -> None:
    history = [
        {"role": "user", "content": "Add 1 and 2, and the time?"},
        {
            "role": "assistant",
            "content": "Both.",
            "tool_calls": [_call("call_x", "add", '{"a": 1, "b": 2}'), _call("call_y", "now", "{}")],
        },
        {"role": "tool", "tool_call_id": "call_y", "content": "12:00"},  # the results in another order
        {"role": "tool", "tool_call_id": "call_x", "content": "3"},
        {"role": "assistant", "content": None, "tool_calls": [_call("call_z", "now", "{}")]},
        {"role": "tool", "tool_call_id": "call_z", "content": "12:01"},
    ]
    prompt = tiny_tokenizer.apply_chat_template(history, tools=specs, chat_template=COMMAND_R7B)
    eos, turn = (
        tiny_tokenizer.decode(tiny_tokenizer.eos_token_ids[:1], skip_special_tokens=False),
        "<|START_OF_TURN_TOKEN|>",
    )
    tools = "".join(json.dumps(t.to_openai(), ensure_ascii=False) + "\n" for t in specs)
    expected = (
        f"{turn}<|SYSTEM_TOKEN|># Tools\n{tools}"
        'Call tools as <|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}]<|END_ACTION|>.'
        f"{eos}{turn}<|USER_TOKEN|>Add 1 and 2, and the time?{eos}"
        f"{turn}<|CHATBOT_TOKEN|><|START_THINKING|>Both.<|END_THINKING|><|START_ACTION|>"
        '[{"tool_call_id": "0", "tool_name": "add", "parameters": {"a": 1, "b": 2}}, '
        f'{{"tool_call_id": "1", "tool_name": "now", "parameters": {{}}}}]<|END_ACTION|>{eos}'
        f'{turn}<|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[{{"tool_call_id": "1", "results": {{"0": "12:00"}}, '
        f'"is_error": null}}]<|END_TOOL_RESULT|>{eos}'
        f'{turn}<|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[{{"tool_call_id": "0", "results": {{"0": "3"}}, '
        f'"is_error": null}}]<|END_TOOL_RESULT|>{eos}'
        f"{turn}<|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|><|START_ACTION|>"
        f'[{{"tool_call_id": "2", "tool_name": "now", "parameters": {{}}}}]<|END_ACTION|>{eos}'
        f'{turn}<|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[{{"tool_call_id": "2", "results": {{"0": "12:01"}}, '
        f'"is_error": null}}]<|END_TOOL_RESULT|>{eos}{turn}<|CHATBOT_TOKEN|>'
    )
    assert prompt == expected


def test_a_command_r_agent_loop_extends_each_prompt_token_for_token(tiny_tokenizer, specs) -> None:
    steps = agent_loop(tiny_tokenizer, specs, R_OUT, memory=ToolCallMemory(), chat_template=COMMAND_R)
    assert_each_step_extends_the_last(steps)
    first = tiny_tokenizer.decode(steps[0][0], skip_special_tokens=False)
    assert "def get_weather(" in first and "# Tools" not in first  # the template rendered the tools itself
    last = tiny_tokenizer.decode(steps[-1][0], skip_special_tokens=False)
    assert "<results>\nDocument: call_" in last  # the results under the calls' OpenAI ids


def test_an_r7b_call_the_memory_knows_renders_through_the_template(tiny_tokenizer, specs) -> None:
    raw = 'Checking.<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "now", "parameters": {}}]<|END_ACTION|>'
    parsed = parse_tool_calls(raw, specs, "command_r7b")
    memory = ToolCallMemory()
    memory.remember(parsed.tool_calls, parsed.raw, content=parsed.content or "")
    results = [{"role": "tool", "tool_call_id": parsed.tool_calls[0].id, "content": "12:00"}]
    history = [{"role": "user", "content": "Time?"}, json.loads(json.dumps(parsed.message())), *results]
    prompt = tiny_tokenizer.apply_chat_template(history, tools=specs, tool_memory=memory, chat_template=COMMAND_R7B)
    assert "<|START_RESPONSE|>" not in prompt  # the call is no plain reply
    assert (
        '<|START_THINKING|>Checking.<|END_THINKING|><|START_ACTION|>[{"tool_call_id": "0", "tool_name": "now", '
        '"parameters": {}}]<|END_ACTION|>'
    ) in prompt


def test_an_r7b_agent_loop_extends_each_prompt_token_for_token(tiny_tokenizer, specs) -> None:
    """R7B's template renders a call as `<|START_THINKING|>plan<|END_THINKING|><|START_ACTION|>` and its own numbering,
    where the model wrote its calls otherwise (no thinking, its own spacing and numbers, a split of its own): every
    turn missed the cache from the reply on. The ids the model emitted now replace the template's text for the reply,
    and the results still find their calls' numbers."""
    steps = agent_loop(tiny_tokenizer, specs, R7B_OUT, memory=ToolCallMemory(), chat_template=COMMAND_R7B,
                       noncanonical=True)  # fmt: skip
    assert_each_step_extends_the_last(steps)
    last = tiny_tokenizer.decode(steps[-1][0], skip_special_tokens=False)
    assert all(raw in last for raw in R7B_OUT)  # each reply as the model wrote it
    assert "<|START_THINKING|>" not in last and "<|START_RESPONSE|>" not in last  # no template text for a reply
    results = (("0", '"{\\"temp\\": 21}"'), ("1", '"3"'), ("2", '"3"'), ("3", '"12:00"'))  # tests/.../test_prefix.py
    for number, result in results:
        assert f'[{{"tool_call_id": "{number}", "results": {{"0": {result}}}' in last  # each result under its call


def test_without_the_emitted_ids_an_r7b_loop_renders_the_templates_text(tiny_tokenizer, specs) -> None:
    """The control: the memory without ids (a stop string cut the reply) leaves the template's text, which is not what
    the model wrote, so the prompt does not extend the last one."""
    steps = agent_loop(tiny_tokenizer, specs, R7B_OUT, memory=ToolCallMemory(), chat_template=COMMAND_R7B,
                       noncanonical=True, tell_ids=False)  # fmt: skip
    with pytest.raises(AssertionError, match="does not extend"):
        assert_each_step_extends_the_last(steps)
    assert "<|START_THINKING|>" in tiny_tokenizer.decode(steps[-1][0], skip_special_tokens=False)


def test_a_template_reading_cohere_tool_definitions_gets_them(tiny_tokenizer, specs) -> None:
    """Command-R and R+'s first tool_use templates read `tool.name` and `tool.parameter_definitions`: given OpenAI's
    function format alone they wrote `def (` for every tool, the model shown no tool's name nor parameter."""
    from tests.command_r_templates import COMMAND_R_V01

    assert template_features(COMMAND_R_V01).format == "command_r"
    prompt = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tools=specs,
                                                chat_template=COMMAND_R_V01)  # fmt: skip
    parameters = {t.name: t.parameters for t in specs}  # tests/smollm2_tools.py: city is required, unit is not
    assert set(parameters["get_weather"]["required"]) == {"city"}
    assert (
        'def get_weather(city: str, unit: str = None) -> List[Dict]:\n    """The current weather in a city."""'
        in prompt
    )
    assert "def add(a: int, b: int) -> List[Dict]:" in prompt and "def now() -> List[Dict]:" in prompt
    plain = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tools=specs,
                                               chat_template=COMMAND_R)  # fmt: skip
    assert '"parameter_definitions"' not in plain and "def get_weather(**kwargs)" in plain  # others as before


def test_placing_r7b_replies_renders_the_history_a_bounded_number_of_times(tiny_tokenizer, specs, monkeypatch) -> None:
    """Each remembered R7B reply was found by rendering the history before it and through it: 2N renders of a growing
    history, 53 s for a prompt of 200 replies. Now one more render marks them all (and a probe of one turn), whatever
    N; each reply is still the text the model wrote, each result under its call's number."""
    from radixcache.runtime.loading import tokenizer as module

    memory, history = ToolCallMemory(), [{"role": "user", "content": "go"}]
    for i in range(30):
        raw = f'<|START_ACTION|>[{{"tool_call_id": "{i}", "tool_name": "now", "parameters": {{}}}}]<|END_ACTION|>'
        parsed = parse_tool_calls(raw, specs, "command_r7b")
        memory.remember(parsed.tool_calls, parsed.raw, tiny_tokenizer.encode(raw, add_special_tokens=False))
        history += [json.loads(json.dumps(parsed.message())), {"role": "tool", "tool_call_id": parsed.tool_calls[0].id,
                                                                 "content": f"r{i}"}]  # fmt: skip
    renders: list[int] = []
    real = module.render_chat_template
    monkeypatch.setattr(module, "render_chat_template", lambda *a, **k: renders.append(len(a[1])) or real(*a, **k))
    prompt = tiny_tokenizer.apply_chat_template(history, tools=specs, tool_memory=memory, chat_template=COMMAND_R7B)
    assert sum(n > 2 for n in renders) <= 2, renders  # the history and its marked copy; the probe's chats are small
    assert "<|START_THINKING|>" not in prompt  # each reply as the model wrote it, numbered as it numbered them
    assert all(f'"tool_call_id": "{i}", "tool_name"' in prompt for i in range(30))
    assert all(f'[{{"tool_call_id": "{i}", "results": {{"0": "r{i}"}}' in prompt for i in range(30))


def test_an_r7b_reply_whose_arguments_spell_the_end_of_turn_keeps_the_templates_text(tiny_tokenizer, specs) -> None:
    """Where a reply's own text spells the end of turn, its end cannot be told from the template's text: it keeps the
    template's text (the prompt right, that reply uncached), and the replies before it are still the model's."""
    eos = tiny_tokenizer.decode(tiny_tokenizer.eos_token_ids[:1], skip_special_tokens=False)
    memory, history = ToolCallMemory(), [{"role": "user", "content": "go"}]
    raws = [
        '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "now", "parameters": {}}]<|END_ACTION|>',
        '<|START_ACTION|>[{"tool_call_id": "1", "tool_name": "get_weather", "parameters": {"city": "EOS"}}]'
        "<|END_ACTION|>".replace("EOS", eos),
    ]
    for raw in raws:
        parsed = parse_tool_calls(raw, specs, "command_r7b")
        memory.remember(parsed.tool_calls, parsed.raw, tiny_tokenizer.encode(raw, add_special_tokens=False))
        history += [json.loads(json.dumps(parsed.message())), {"role": "tool", "tool_call_id": parsed.tool_calls[0].id,
                                                                 "content": "ok"}]  # fmt: skip
    prompt = tiny_tokenizer.apply_chat_template(history, tools=specs, tool_memory=memory, chat_template=COMMAND_R7B)
    plain = tiny_tokenizer.apply_chat_template(history, tools=specs, chat_template=COMMAND_R7B)
    first = plain.index("<|START_THINKING|>")
    assert prompt == plain[:first] + raws[0] + plain[plain.index(eos, first) :]  # the first the model's, the second not
