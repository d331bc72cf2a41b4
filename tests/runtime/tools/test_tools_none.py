"""A template that reads `tools` got no `tools` variable for a chat without tools, where transformers passes
`tools=None`: Mistral 7B v0.3's `{%- if tools is not none %}` holds for an undefined `tools`, so every plain chat on
such a model read an empty `[AVAILABLE_TOOLS] [][/AVAILABLE_TOOLS]` block it never saw in training (and a template
that writes `tools|tojson` there failed: "Object of type Undefined is not JSON serializable"). It is None now; the
reference is Jinja rendering the template as transformers calls it."""

from __future__ import annotations

import json

import jinja2
import pytest

from radixcache.runtime.tools import normalize_tools

V03_TOOLS = (  # Mistral-7B-Instruct-v0.3's tools block, before the last user message
    "{{- bos_token }}"
    "{%- set user_messages = messages | selectattr('role', 'equalto', 'user') | list %}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- if tools is not none and (message == user_messages[-1]) %}{{- '[AVAILABLE_TOOLS] [' }}"
    "{%- for tool in tools %}{{- tool.function.name }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}"
    "{{- '][/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{{- '[INST] ' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- ' ' + message['content']|trim + eos_token }}{%- endif %}{%- endfor %}"
)
TOJSON = "{% if tools is not none %}{{ tools|tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
CHAT = [
    {"role": "user", "content": "Hi."},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "2+3?"},
]


def transformers_render(source: str, tools, bos: str, eos: str) -> str:
    """As transformers' apply_chat_template calls a template: `tools` always given, None without tools."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(  # transformers'
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )
    return env.from_string(source).render(messages=CHAT, tools=tools, bos_token=bos, eos_token=eos)


@pytest.mark.parametrize("source", [V03_TOOLS, TOJSON], ids=["v0.3", "tojson"])
def test_a_chat_without_tools_renders_as_transformers_renders_it(tiny_tokenizer, source: str) -> None:
    bos, eos = (
        tiny_tokenizer._token_text(tiny_tokenizer.bos_token_id),
        tiny_tokenizer._token_text(tiny_tokenizer.eos_token_ids[0]),
    )
    ours = tiny_tokenizer.apply_chat_template(CHAT, add_generation_prompt=False, chat_template=source)
    assert ours == transformers_render(source, None, bos or "", eos or "")
    assert "AVAILABLE_TOOLS" not in ours
    specs = normalize_tools([{"type": "function", "function": {"name": "add"}}])
    with_tools = tiny_tokenizer.apply_chat_template(
        CHAT, add_generation_prompt=False, chat_template=source, tools=specs
    )
    assert with_tools == transformers_render(source, [t.to_openai() for t in specs], bos or "", eos or "")
