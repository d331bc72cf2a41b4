"""Agent histories through Tokenizer.apply_chat_template: assistant tool calls with null content, tool results,
`name`, content as text parts, and the developer role rendered as the system message (in SmolLM2's template it
replaces the default system prompt instead of following it); bad messages and tools raise ChatMessageError naming
messages[i].field or tools[i].field."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from radixcache.runtime.loading.chat_template import ChatMessageError, ChatTemplateError
from radixcache.runtime.tools import (
    TemplateFeatures,
    ToolInputError,
    normalize_messages,
    normalize_tool_choice,
    normalize_tools,
    template_features,
)

CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
HISTORY = [
    {"role": "user", "content": [{"type": "text", "text": "Add "}, {"type": "text", "text": "1 and 2."}]},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "3"},
]
SMOL_DEFAULT = "You are a helpful AI assistant named SmolLM"


@pytest.mark.slow
def test_a_tool_history_renders_on_smollm2(smollm2_tokenizer, specs) -> None:
    text = smollm2_tokenizer.apply_chat_template(HISTORY, tools=specs)
    assert "<|im_start|>user\nAdd 1 and 2.<|im_end|>" in text
    assert '<|im_start|>assistant\n{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}<|im_end|>' in text
    # SmolLM2's template has no tool turn: the result is a user message with a clear prefix
    assert "<|im_start|>user\nTool result for add (call_1):\n3<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_the_developer_role_is_the_system_message(smollm2_tokenizer) -> None:
    dev = [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
    text = smollm2_tokenizer.apply_chat_template(dev)
    assert text.startswith("<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>user\nHi")
    assert SMOL_DEFAULT not in text
    sys = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
    assert text == smollm2_tokenizer.apply_chat_template(sys)


@pytest.mark.slow
def test_tools_go_into_the_system_message(smollm2_tokenizer, specs) -> None:
    dev = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = smollm2_tokenizer.apply_chat_template(dev, tools=specs)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert text.count("<|im_start|>system") == 1
    assert '{"name": "now", "description": "The time.", "parameters": {"type": "object", "properties": {}}}' in text


def test_names_and_plain_histories_render_as_before(tiny_tokenizer) -> None:
    msgs = [{"role": "user", "content": "hi", "name": "ann"}, {"role": "assistant", "content": "yo"}]
    assert tiny_tokenizer.apply_chat_template(msgs) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>assistant\n"
    )


ARGS = "messages[0].tool_calls[0].function.arguments"
DEEP: dict[str, object] = {}
for _ in range(5000):
    DEEP = {"a": DEEP}


@pytest.mark.parametrize(
    ("messages", "path"),
    [
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": None}], "messages[0].content"),
        *(([{"role": role, "content": []}], "messages[0].content") for role in ("user", "system", "developer")),
        (
            [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c", "content": []}],
            "messages[1].content",
        ),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages[0].content[0].text"),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text"),
        ([{"role": "user", "content": "x"}, {"role": "tool", "content": "3"}], "messages[1].tool_call_id"),
        ([{"role": "user", "content": "x", "tool_calls": [CALL]}], "messages[0].tool_calls"),
        ([{"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": ""}]}], "messages[0].tool_calls[0].id"),
        *(  # an object nested past the recursion limit (a RecursionError), or holding what JSON cannot write
            ([{"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "add", "arguments": bad}}]}], ARGS)
            for bad in (DEEP, {"a": {1, 2}}, {"a": b"x"}, {"a": float("nan")})
        ),
        ([{"role": "user", "content": "x", "name": 5}], "messages[0].name"),
        ([{"role": "user", "content": "x", "tool_call_id": "c"}], "messages[0].tool_call_id"),
        (["hello"], "messages[0]"),
    ],
)
def test_bad_messages_name_the_field(tiny_tokenizer, messages, path: str) -> None:
    with pytest.raises(ChatMessageError) as info:
        tiny_tokenizer.apply_chat_template(messages)
    assert info.value.path == path
    assert str(info.value).startswith(path + ": ")
    assert isinstance(info.value, ChatTemplateError) and isinstance(info.value, ToolInputError)


@pytest.mark.parametrize(
    ("tools", "path"),
    [
        ({"type": "function"}, "tools"),
        ([{"type": "retrieval"}], "tools[0].type"),
        ([{"type": "function"}], "tools[0].function"),
        ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "a" * 65}}], "tools[0].function.name"),
        ([{"function": {"name": "a"}}, {"function": {"name": "a"}}], "tools[1].function.name"),
        ([{"function": {"name": "a", "parameters": []}}], "tools[0].function.parameters"),
        ([{"function": {"name": "a", "parameters": {"type": "string"}}}], "tools[0].function.parameters.type"),
        ([{"function": {"name": "a", "description": 1}}], "tools[0].function.description"),
        ([{"function": {"name": "a", "strict": "yes"}}], "tools[0].function.strict"),
        ([{"function": {"name": "a", "params": {"type": "object"}}}], "tools[0].function.params"),  # was dropped
        ([{"type": "function", "function": {"name": "a"}, "name": "a"}], "tools[0].name"),
    ],
)
def test_bad_tools_name_the_field(tiny_tokenizer, tools, path: str) -> None:
    with pytest.raises(ChatMessageError) as info:
        tiny_tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=tools)
    assert info.value.path == path


def test_tool_choice(specs) -> None:
    assert normalize_tool_choice(None, specs).mode == "auto"
    assert normalize_tool_choice(None, ()).mode == "none"
    assert normalize_tool_choice("required", specs).mode == "required"
    named = normalize_tool_choice({"type": "function", "function": {"name": "add"}}, specs)
    assert (named.mode, named.name) == ("function", "add")
    nulls = {"type": "function", "function": {"name": "add", "x": None}, "y": None}  # a null field is absent
    assert normalize_tool_choice(nulls, specs) == named
    for bad, path in [
        ("sometimes", "tool_choice"),
        ({"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name"),
        ({"type": "function"}, "tool_choice"),
        (3, "tool_choice"),
        # an unknown field was dropped, the choice taken without it (as a tool's was until it too was refused)
        ({"type": "function", "function": {"name": "add"}, "functon": 1}, "tool_choice.functon"),
        ({"type": "function", "function": {"name": "add", "arguments": "{}"}}, "tool_choice.function.arguments"),
    ]:
        with pytest.raises(ToolInputError) as info:
            normalize_tool_choice(bad, specs)
        assert info.value.path == path
    with pytest.raises(ToolInputError, match="needs at least one tool"):
        normalize_tool_choice("required", normalize_tools([]))


def test_tool_messages_get_the_name_of_their_call() -> None:
    msgs = normalize_messages(HISTORY)
    assert msgs[2].name == "add" and msgs[1].content is None and msgs[0].content == "Add 1 and 2."


def test_an_empty_part_list_on_an_assistant_message_is_null_content(tiny_tokenizer) -> None:
    """OpenAI refuses `content: []`; where null is allowed (an assistant message, calls or not) it reads as null, so a
    client that writes a call-only turn's content as no parts renders the prompt null gives."""
    with_null = normalize_messages(HISTORY)
    with_empty = normalize_messages([HISTORY[0], {**HISTORY[1], "content": []}, HISTORY[2]])
    assert with_empty == with_null and with_empty[1].content is None
    plain = [{"role": "user", "content": "x"}, {"role": "assistant"}]
    empty = [{"role": "user", "content": "x"}, {"role": "assistant", "content": []}]
    assert tiny_tokenizer.apply_chat_template(empty) == tiny_tokenizer.apply_chat_template(plain)


@pytest.mark.slow
def test_smollm2_gets_the_generic_format(smollm2_tokenizer, tiny_tokenizer) -> None:
    for tok in (smollm2_tokenizer, tiny_tokenizer):
        assert template_features(tok.chat_template) == TemplateFeatures()
        assert template_features(tok.chat_template).format == "generic"
    assert template_features("{% for t in tools %}{{ t | tojson }}{% endfor %}").format == "native"
    assert template_features("{% if m.role == 'ipython' %}<tool_call>{% endif %}{{ tools }}").format == "hermes"
    assert template_features("{% if m.role == 'tool' %}x{% endif %}").tool_role
    assert template_features("{% broken") == TemplateFeatures()


def test_a_template_with_generation_blocks_keeps_its_tool_features() -> None:
    """TRL's `{% generation %}` tag made the parse fail, so a fine-tuned Qwen template's tools were rendered in the
    generic format and its <tool_call> tags never parsed."""
    source = (
        "{% for t in tools %}{{ t | tojson }}{% endfor %}{% for m in messages %}{% if m.role == 'tool' %}x"
        "{% elif m.role == 'assistant' %}{% generation %}<tool_call>{{ m.content }}{% endgeneration %}{% endif %}"
        "{% endfor %}"
    )
    expected = TemplateFeatures(uses_tools=True, tool_role=True, hermes=True, ignores_calls=True)  # no `tool_calls`
    assert template_features(source) == expected


@pytest.mark.parametrize("replayed", ['{"a": true, "b": false}', '{"a": "1", "b": 0}', '{"a": 1, "b": 0.5}'])
def test_a_call_replayed_with_other_arguments_renders_them(tiny_tokenizer, specs, replayed: str) -> None:
    """The memory compared a replayed call's arguments with == on the decoded values, which holds `true` equal to
    `1`: a call whose arguments the client had changed so rendered as the model's text, and the prompt said `1`
    where the history said `true`. Whitespace, escapes, key order and a number's spelling still match."""
    from radixcache.runtime.tools import ToolCallMemory, parse_tool_calls

    memory = ToolCallMemory()
    output = '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 0}}]}'
    call = parse_tool_calls(output, specs).tool_calls[0]
    memory.remember([call], output)
    ask = [{"role": "user", "content": "Add."}]

    def prompt(arguments: str, with_memory: bool = True) -> str:
        function = {"name": "add", "arguments": arguments}
        replay = {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": call.id, "function": function}]}
        kw = {"tool_memory": memory} if with_memory else {}
        return tiny_tokenizer.apply_chat_template([*ask, replay], tools=specs, **kw)

    assert replayed in prompt(replayed) and prompt(replayed) == prompt(replayed, with_memory=False)
    assert output in prompt('{"b":0,  "a":1}') and output in prompt('{"a": 1, "b": 0}')


def test_parameters_nested_past_the_encoder_are_a_tool_input_error(tiny_tokenizer) -> None:
    """Parameters nested a few thousand levels deep (the server bounds nesting; Python callers are not) raised
    RecursionError out of normalize_tools, not the ValueError naming the field that every other bad tool gets, as
    a call's arguments nested as deep already did."""
    deep: dict[str, object] = {"type": "object"}
    for _ in range(5000):
        deep = {"type": "object", "properties": {"a": deep}}
    tools = [{"function": {"name": "f", "parameters": deep}}]
    with pytest.raises(ToolInputError, match=re.escape("tools[0].function.parameters: is nested too deeply")):
        normalize_tools(tools)
    with pytest.raises(ChatMessageError, match=re.escape("tools[0].function.parameters")):
        tiny_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools)


def test_the_call_memory_is_bounded_by_bytes_as_well_as_entries() -> None:
    """The memory kept up to 4,096 replies whatever their size: each may be a whole context of text and token ids,
    about a gigabyte in all. Now the bytes are bounded too (least recently used dropped first), checked against a
    plain list of what was remembered; the newest reply always stays, and one heavier than an eighth of the bound
    is not kept (it would flush all the others)."""
    from radixcache.runtime.tools import ToolCallMemory
    from radixcache.runtime.tools.messages import ToolCall

    memory = ToolCallMemory(max_entries=100, max_bytes=100_000)
    calls = [(ToolCall(f"call_{i}", "f", "{}"),) for i in range(40)]
    for call in calls:
        memory.remember(call, "x" * 10_000, token_ids=range(100), content=None)
        assert memory.bytes <= 100_000
        assert memory.lookup(call) == "x" * 10_000  # the newest is kept
    kept = [c for c in calls if memory.lookup(c) is not None]
    assert kept == calls[-len(kept) :] and 1 <= len(kept) <= 9  # ~11 KB each under 100 KB
    memory.remember(calls[-1], "y", content=None)  # a call remembered again is counted once
    assert memory.lookup(calls[-1]) == "y" and memory.bytes < 100_000
    huge = (ToolCall("call_huge", "f", "{}"),)
    memory.remember(huge, "z" * 200_000)
    assert memory.lookup(huge) is None and [c for c in calls if memory.lookup(c) is not None] == kept
    with pytest.raises(ValueError, match="max_bytes"):
        ToolCallMemory(max_bytes=0)


@pytest.mark.parametrize("text", ['{"a": 1, "b', "{1", "[1]", '{"a": NaN}', '{"a": ' + "[" * 5000 + "]" * 5000 + "}"])
def test_arguments_text_that_is_no_json_object_renders_as_written(text: str) -> None:
    """A call the length limit cut, replayed as received, was refused (its arguments are no JSON), so every later
    turn failed; OpenAI takes any string. Text is kept as written: the generic format writes it as is, a template
    that takes arguments as objects gets the text, and the call memory finds the reply the model wrote."""
    from radixcache.runtime.tools import ToolCallMemory, template_messages

    call = {**CALL, "function": {"name": "add", "arguments": text}}
    (message,) = normalize_messages([{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert message.tool_calls[0].arguments == text
    generic, _ = template_messages([message], TemplateFeatures())
    assert generic[0]["content"] == '{"tool_calls": [{"name": "add", "arguments": ' + text + "}]}"
    native, _ = template_messages([message], TemplateFeatures(uses_tools=True))
    assert native[0]["tool_calls"][0]["function"]["arguments"] == text
    memory = ToolCallMemory()
    memory.remember(message.tool_calls, "what the model wrote", content="")
    assert memory.lookup(message.tool_calls) == "what the model wrote"
    other = normalize_messages(
        [{"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "add", "arguments": text + "x"}}]}]
    )
    assert memory.lookup(other[0].tool_calls) is None  # other text: not that reply


# What the model may write, and JSON.stringify(JSON.parse(it)) (node 20): how a JS client (the Vercel AI SDK, which
# keeps a call's arguments as an object) sends the call back.
MODEL_ARGUMENTS = '{"a": 1.0, "b": 1e5, "c": -0.0, "d": 1.50, "e": 12345678901234567890, "f": "\\u00e9\\/", "g": 2E21}'
STRINGIFIED = '{"a":1,"b":100000,"c":0,"d":1.5,"e":12345678901234567000,"f":"é/","g":2e+21}'


def _stringified(arguments: str) -> str:
    node = shutil.which("node")
    if node is None:
        return STRINGIFIED  # node's own answer, kept
    code = "process.stdout.write(JSON.stringify(JSON.parse(process.argv[1])))"
    return subprocess.run([node, "-e", code, arguments], capture_output=True, text=True, check=True).stdout


def test_a_call_its_client_rebuilt_with_json_stringify_renders_as_the_model_wrote_it(tiny_tokenizer) -> None:
    """JSON.stringify writes `1.0` as `1`, `1e5` as `100000`, `-0` as `0` (the same JavaScript numbers): the memory
    held them for other arguments, so every turn after such a call re-rendered it and missed the cache from there."""
    from radixcache.runtime.tools import ToolCallMemory, normalize_tools, parse_tool_calls

    specs = normalize_tools([{"type": "function", "function": {"name": "f"}}])
    output = f'{{"tool_calls": [{{"name": "f", "arguments": {MODEL_ARGUMENTS}}}]}}'
    (call,) = parse_tool_calls(output, specs).tool_calls
    memory = ToolCallMemory()
    memory.remember([call], output)
    stringified = _stringified(call.arguments)
    assert stringified == STRINGIFIED
    ask = [{"role": "user", "content": "Call f."}]
    replay = {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": call.id, "function": {"name": "f"}}]}
    replay["tool_calls"][0]["function"]["arguments"] = stringified
    prompt = tiny_tokenizer.apply_chat_template([*ask, replay], tools=specs, tool_memory=memory)
    assert prompt.startswith(tiny_tokenizer.apply_chat_template(ask, tools=specs) + output)
    for other in ('{"a":true}', stringified.replace('"b":100000', '"b":100001'), stringified.replace("1.5", '"1.5"')):
        replay["tool_calls"][0]["function"]["arguments"] = other  # not the same values: rendered as given
        assert other in tiny_tokenizer.apply_chat_template([*ask, replay], tools=specs, tool_memory=memory)


def test_numbers_past_the_doubles_are_not_one_value() -> None:
    """A number past the doubles was read as infinity, so the memory held `{"n": 1e309}` and `{"n": 2e309}` (or two
    different 400-digit integers) for one call, and a history replaying other arguments rendered as the text the model
    wrote for these. Such arguments compare as their text."""
    from radixcache.runtime.tools import ToolCall, ToolCallMemory
    from radixcache.runtime.tools.messages import canonical_arguments

    huge = "1" + "0" * 400
    pairs = [('{"n": 1e309}', '{"n": 2e309}'), (f'{{"n": {huge}}}', f'{{"n": {huge[:-1]}1}}'), ("[-1e999]", "[-2e999]")]
    for made, other in pairs:
        assert canonical_arguments(made) != canonical_arguments(other)
        memory = ToolCallMemory()
        memory.remember([ToolCall("call_1", "f", made)], "what the model wrote", content="")
        assert memory.lookup([ToolCall("call_1", "f", other)]) is None
        assert memory.lookup([ToolCall("call_1", "f", made)]) == "what the model wrote"
    assert canonical_arguments('{"n": 1e308}') == canonical_arguments('{"n": 1E+308}')  # still a double: one value
