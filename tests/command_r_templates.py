"""Chat templates in Cohere's tool formats, written for these tests from the public description of the formats (not
Cohere's own files): `COMMAND_R`, as Command-R and Command-R+ render tools and calls (`Action: ```json [{"tool_name",
"parameters"}]``` `, tool results in a system turn), and `COMMAND_R7B`, as Command R7B does (the plan in
`<|START_THINKING|>`, calls in `<|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}]<|END_ACTION|>` numbered
from 0 across the history, each result in `<|START_TOOL_RESULT|>` under its call's number, a plain reply in
`<|START_RESPONSE|>`). Each turn ends with the tokenizer's EOS (Cohere's `<|END_OF_TURN_TOKEN|>`), so the tiny
checkpoint's tokenizer and model stop where they would. Used by the parser, rendering, engine and server tests."""

from __future__ import annotations

_TURN = "<|START_OF_TURN_TOKEN|>"
_TOOLS_R = (
    "{% if tools %}" + _TURN + "<|SYSTEM_TOKEN|>## Available Tools\nHere is a list of tools that you have available to "
    "you:\n{% for t in tools %}\n```python\ndef {{ t.function.name }}(**kwargs) -> List[Dict]:\n"
    '    """{{ t.function.description }}"""\n    pass\n```\n{% endfor %}\n'
    "Write 'Action:' followed by a json-formatted list of actions, each with the tool_name and its parameters, "
    "or answer in plain text.{{ eos_token }}{% endif %}"
)
COMMAND_R = (
    _TOOLS_R + "{% for m in messages %}"
    "{% if m.role == 'system' %}" + _TURN + "<|SYSTEM_TOKEN|>{{ m.content }}{{ eos_token }}"
    "{% elif m.role == 'user' %}" + _TURN + "<|USER_TOKEN|>{{ m.content }}{{ eos_token }}"
    "{% elif m.role == 'assistant' %}" + _TURN + "<|CHATBOT_TOKEN|>{{ m.content }}"
    "{% if m.tool_calls %}Action: ```json\n[{% for c in m.tool_calls %}"
    "{{ {'tool_name': c.function.name, 'parameters': c.function.arguments} | tojson }}"
    "{% if not loop.last %}, {% endif %}{% endfor %}]\n```{% endif %}{{ eos_token }}"
    "{% elif m.role == 'tool' %}" + _TURN + "<|SYSTEM_TOKEN|><results>\nDocument: {{ m.tool_call_id }}\n"
    "{{ m.content }}\n</results>{{ eos_token }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}" + _TURN + "<|CHATBOT_TOKEN|>{% endif %}"
)
COMMAND_R7B = (
    "{% if tools %}" + _TURN + "<|SYSTEM_TOKEN|># Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    'Call tools as <|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}]<|END_ACTION|>.'
    "{{ eos_token }}{% endif %}{% set ns = namespace(ids=[]) %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' %}" + _TURN + "<|SYSTEM_TOKEN|>{{ m.content }}{{ eos_token }}"
    "{% elif m.role == 'user' %}" + _TURN + "<|USER_TOKEN|>{{ m.content }}{{ eos_token }}"
    "{% elif m.role == 'assistant' and m.tool_calls %}" + _TURN + "<|CHATBOT_TOKEN|>"
    "<|START_THINKING|>{{ m.tool_plan }}<|END_THINKING|><|START_ACTION|>[{% for c in m.tool_calls %}"
    '{"tool_call_id": "{{ ns.ids | length }}", "tool_name": {{ c.function.name | tojson }}, '
    '"parameters": {{ c.function.arguments | tojson }}}{% if not loop.last %}, {% endif %}'
    "{% set ns.ids = ns.ids + [c.id] %}{% endfor %}]<|END_ACTION|>{{ eos_token }}"
    "{% elif m.role == 'assistant' %}" + _TURN + "<|CHATBOT_TOKEN|><|START_RESPONSE|>{{ m.content }}"
    "<|END_RESPONSE|>{{ eos_token }}"
    "{% elif m.role == 'tool' %}" + _TURN + '<|SYSTEM_TOKEN|><|START_TOOL_RESULT|>[{"tool_call_id": "'
    "{% for i in ns.ids %}{% if i == m.tool_call_id %}{{ loop.index0 }}{% endif %}{% endfor %}"
    '", "results": {"0": {{ m.content | tojson }}}, "is_error": null}]<|END_TOOL_RESULT|>{{ eos_token }}'
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}" + _TURN + "<|CHATBOT_TOKEN|>{% endif %}"
)

# Command-R / R+'s first tool_use templates read each tool in Cohere's own shape, not OpenAI's: `name`, `description`
# and `parameter_definitions` ({parameter: {description, type, required}}), and write a Python signature of it.
COMMAND_R_V01 = COMMAND_R.replace(
    'def {{ t.function.name }}(**kwargs) -> List[Dict]:\n    """{{ t.function.description }}"""',
    "def {{ t.name }}({% for p, d in t.parameter_definitions.items() %}{{ p }}: {{ d.type }}"
    "{% if not d.required %} = None{% endif %}{% if not loop.last %}, {% endif %}{% endfor %}) -> List[Dict]:\n"
    '    """{{ t.description }}"""',
)
