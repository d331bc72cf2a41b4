"""What the chat-template sandbox (loading/template_sandbox.py, template_bounds.py) costs a render, against Jinja.

    python scripts/bench_templates.py [--lengths 11,101,401] [--rounds 7] [--repeats 20] [--json FILE]

Each template (ChatML, Llama 3, Gemma, Qwen2.5 with tools, Mistral's) renders a chat of each length (messages,
system included where the template takes one; Qwen2.5's has tool calls and results) in two ways: in Jinja's own
immutable sandbox without bounds, as transformers renders (`jinja ms`; at these templates it costs what a plain
`jinja2.Environment` does), and through `render_chat_template` (`sandbox ms`: the bounded sandbox, its checks of the
messages and its output collection), from templates compiled once. Both outputs are checked equal first. A round
times `--repeats` renders of each way back to back, the order alternating by round, so a busy minute of the machine
hits both alike; the table gives each way's fastest render of all (on a shared machine the noise only adds) and
their ratio. Run it alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # script_args, also when loaded by path (the tests)

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from script_args import at_least

from radixcache.runtime.loading.chat_template import _raise_exception, _tojson, render_chat_template
from radixcache.runtime.tools.features import GenerationBlock

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0"
    " %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)
QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided \
with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\
\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == \
"assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city, now.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TEXT = "Here is a sentence of an agent's long chat, about as long as a short paragraph of prose. "


def chat(length: int, system: bool, tools: bool) -> list[dict[str, Any]]:
    """About `length` messages (after a system message where `system`): exchanges of a user's message and the
    assistant's reply, with `tools` every third reply after a tool call and its result; cut to `length`, then
    to end before the assistant's turn (fewer by one or two where it fell on the assistant's)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful agent."}] if system else []
    j = 0
    while len(out) < length:
        out.append({"role": "user", "content": f"{TEXT * 2}({j})"})
        if tools and j % 3 == 2:
            call = {"function": {"name": "get_weather", "arguments": {"city": f"Paris {j}"}}}
            out += [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "21 C"}]
        out.append({"role": "assistant", "content": f"{TEXT * 3}[{j}]"})
        j += 1
    out = out[:length]
    while out[-1]["role"] == "assistant":
        out.pop()
    return out


TEMPLATES = {  # name: (source, takes a system message, renders tools)
    "chatml": (CHATML, True, False),
    "llama3": (LLAMA3, True, False),
    "gemma": (GEMMA, False, False),
    "qwen2.5+tools": (QWEN25, True, True),
    "mistral": (MISTRAL, False, False),
}
VARIABLES = {"bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": True}


def jinja_render(source: str) -> Callable[..., str]:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationBlock]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source).render


def best_render(render: Callable[[], str], repeats: int) -> float:
    """The fastest of `repeats` renders, in seconds: on a shared machine the noise only adds."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        render()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="11,101,401", help="chat lengths in messages, comma-separated")
    ap.add_argument("--rounds", type=at_least(1), default=7)
    ap.add_argument("--repeats", type=at_least(1), default=20, help="renders of each way a round")
    ap.add_argument("--templates", default=",".join(TEMPLATES), help="which, comma-separated")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        lengths = [at_least(2)(x) for x in args.lengths.split(",")]
    except argparse.ArgumentTypeError as e:
        ap.error(f"--lengths: {e}")
    names = args.templates.split(",")
    unknown = [n for n in names if n not in TEMPLATES]
    if unknown:
        ap.error(f"--templates: unknown {unknown[0]!r}; choose from {', '.join(TEMPLATES)}")
    print(f"{args.rounds} rounds of {args.repeats} renders each way, load average {os.getloadavg()[0]:.2f}")
    rows = []
    for name in names:
        source, system, tools = TEMPLATES[name]
        plain = jinja_render(source)
        for length in lengths:
            messages = chat(length, system, tools)
            variables = {**VARIABLES, "tools": TOOLS if tools else None}
            ways: dict[str, Callable[[], str]] = {
                "jinja": lambda p=plain, m=messages, v=variables: p(messages=m, **v),  # type: ignore[misc]
                "sandbox": lambda s=source, m=messages, v=variables: render_chat_template(s, m, **v),  # type: ignore[misc]
            }
            if ways["jinja"]() != ways["sandbox"]():
                raise SystemExit(f"{name}, {length} messages: the sandbox's output differs from Jinja's")
            times: dict[str, list[float]] = {"jinja": [], "sandbox": []}
            for rnd in range(args.rounds):
                for way in ("jinja", "sandbox") if rnd % 2 == 0 else ("sandbox", "jinja"):
                    times[way].append(best_render(ways[way], args.repeats))
            jinja_ms, sandbox_ms = (min(times[w]) * 1e3 for w in ("jinja", "sandbox"))
            row = {"template": name, "messages": len(messages), "jinja_ms": jinja_ms, "sandbox_ms": sandbox_ms}
            rows.append(row | {"ratio": sandbox_ms / jinja_ms})
            print(f"{name} {len(messages)}: jinja {jinja_ms:.3f} ms, sandbox {sandbox_ms:.3f} ms", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("\n| template | messages | jinja ms | sandbox ms | sandbox / jinja |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['template']} | {r['messages']} | {r['jinja_ms']:.3f} | {r['sandbox_ms']:.3f} | {r['ratio']:.2f}x |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
