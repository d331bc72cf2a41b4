"""A template that reads `tools` but renders no tool turn and never reads `tool_calls` (a plain chat loop over user
and assistant messages, as some tool-use templates have): the assistant's calls and the tools' results were given as
fields it never reads, so both vanished from the prompt and the model never saw what it had called nor the answer.
Now the calls go as the text the model writes them in (the generic JSON, Hermes tags, Command-R's `Action:` block)
and the results as the generic format's user messages."""

from __future__ import annotations

import pytest

from radixcache.runtime.tools import template_features

LOOP = (
    "{% for m in messages %}{% if m.role == 'user' %}U: {{ m.content }}\n"
    "{% elif m.role == 'assistant' %}A: {{ m.content }}\n{% endif %}{% endfor %}A:"
)
TEMPLATES = {  # each reads `tools`, has no tool turn and never reads `tool_calls`
    "native": "[{% for t in tools %}{{ t.function.name }}{% endfor %}]" + LOOP,
    "hermes": "[{% for t in tools %}{{ t.function.name }}{% endfor %}] Call as <tool_call>...</tool_call>" + LOOP,
    "command_r": "[{% for t in tools %}{{ t.function.name }}{% endfor %}] Action: a list of tool_name" + LOOP,
}
CALLS = {
    "native": '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]}',
    "hermes": '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
    '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
    "command_r": 'Action: ```json\n[{"tool_name": "add", "parameters": {"a": 1, "b": 2}}, '
    '{"tool_name": "now", "parameters": {}}]\n```',
}


@pytest.mark.parametrize("fmt", list(TEMPLATES))
def test_calls_and_results_a_template_does_not_read_are_rendered_as_text(tiny_tokenizer, specs, fmt: str) -> None:
    template = TEMPLATES[fmt]
    features = template_features(template)
    assert features.format == fmt and features.ignores_calls and not features.tool_role
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
        {"id": "call_b", "type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]
    history = [
        {"role": "user", "content": "1+2, and the time?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_a", "content": "3"},
        {"role": "tool", "tool_call_id": "call_b", "content": "12:00"},
    ]
    prompt = tiny_tokenizer.apply_chat_template(history, tools=specs, chat_template=template)
    head = template.split("{% for m in messages %}")[0].replace(
        "{% for t in tools %}{{ t.function.name }}{% endfor %}", ""
    )
    names = "".join(t.name for t in specs)
    assert prompt == (
        head.replace("[]", f"[{names}]") + f"U: 1+2, and the time?\nA: {CALLS[fmt]}\n"
        "U: Tool result for add (call_a):\n3\nU: Tool result for now (call_b):\n12:00\nA:"
    )
