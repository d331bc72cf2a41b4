"""A chat template (a model file's, or `chat_template=`) is bounded while it renders: a hostile one is refused with a
ChatTemplateError naming the bound, quickly and without taking GB, and real templates render as before."""

from __future__ import annotations

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from radixcache.runtime.loading.chat_template import (
    ChatTemplateError,
    _raise_exception,
    _tojson,
    render_chat_template,
)
from radixcache.runtime.tools.features import GenerationBlock, TemplateFeatures, template_features

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("template", "bound"),
    [
        ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "steps"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"),
        (
            "{% for a in messages * 50 %}{% for b in messages * 50 %}{% for c in range(100000) %}{% endfor %}"
            "{% endfor %}{% endfor %}",
            "steps",
        ),
        ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}", "steps"),
        ('{{ "a" * 10**10 }}', "repetition"),
        ('{{ 10**10 * "a" }}', "repetition"),
        ('{{ ["a"] * 10**10 }}', "repetition"),
        ("{{ 2 ** (10**10) }}", "digits"),
        ("{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}", "digits"),
        ('{% set ns = namespace(s="ab") %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}', "~"),
        ('{% set ns = namespace(s="ab") %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}', "conc"),
        ('{{ "a" | center(10**10) }}', "center"),
        ('{{ "a".ljust(10**10) }}', "ljust"),
        ('{{ "%01000000000d" % 1 }}', "width"),
        ('{{ "%*d" % (10**10, 1) }}', "10000000000"),
        ('{{ "%*d" | format(10**10, 1) }}', "10000000000"),
        ('{{ "{:>1000000000}".format(1) }}', "width"),
        ('{{ "{:>{}}".format(1, 10**10) }}', "10000000000"),
        ('{{ ("a" * 1000000).replace("a", "a" * 1000) }}', "replace"),
        ('{{ ("a" * 1000000) | replace("a", "a" * 1000) }}', "replace"),
        ('{{ (["a" * 10000000] * 1000) | join }}', "join"),
        ('{{ range(1000) | map("center", 16000000) | join }}', "in all"),
        (
            '{% set ns = namespace(kept=[]) %}{% for i in range(40) %}{% set ns.kept = ns.kept + [("ab " * 2000000)'
            ".split()] %}{% endfor %}",
            "in all",
        ),
        ('{% for i in range(100) %}{{ "a" * 1000000 }}{% endfor %}', "output"),
        ("{{ messages | tojson(indent=10**8) }}", "tojson"),
        (
            '{% set big = "ab" * 8000000 %}{% for i in range(100000) %}{% if "zz" in big %}{% endif %}{% endfor %}',
            "steps",
        ),
        ('{% set big = "ab" * 8000000 %}{% for i in range(100000) %}{{ big.count("zz") }}{% endfor %}', "steps"),
        (
            '{% set a = "ab" * 8000000 %}{% set b = "a" ~ a[1:] %}{% for i in range(100000) %}'
            "{% if a == b %}{% endif %}{% endfor %}",
            "steps",
        ),
        ('{% set big = "ab" * 8000000 %}{% for i in range(100000) %}{% if big[1:] %}{% endif %}{% endfor %}', "steps"),
        ('{% for i in range(8) %}{{ ("a " * 8000000) | wordwrap(5) | length }}{% endfor %}', "steps"),
        (
            '{% for i in range(8) %}{{ (["b", "a"] * 2000000) | select("equalto", "a") | list | length }}{% endfor %}',
            "steps",
        ),
        ('{{ ["a"] | batch(10**8, "x") | list | length }}', "batch"),
        (
            "{% for x in range(100000) recursive %}{% if x < 3 and loop.depth < 10 %}{{ loop(range(100000)) }}"
            "{% endif %}{% endfor %}",
            "steps",
        ),
        (
            '{% set ns = namespace(s="ab") %}{% for i in range(60) %}{% set x %}{{ ns.s }}{{ ns.s }}{% endset %}'
            "{% set ns.s = x %}{% endfor %}",
            "over",
        ),
    ],
)
def test_a_hostile_template_is_stopped_at_a_bound(template, bound):
    """Each ran for hours or took many GB (transformers renders them the same): a server loading a hub's GGUF
    was held at its first chat."""
    with pytest.raises(ChatTemplateError, match=r"chat template of evil\.gguf was stopped: .*" + bound):
        render_chat_template(template, HI, model="evil.gguf")


def test_a_template_over_the_source_bound_is_refused_before_it_compiles():
    """Jinja compiles some 150 KB a second, here about 3 s per 500 KB: a GGUF's template of 100 MB held the first
    chat for most of an hour."""
    with pytest.raises(ChatTemplateError, match="the chat template is 500000 characters, over the 262144"):
        render_chat_template("{{ messages[0].content }}" * 20000, HI, model="evil.gguf")


def test_a_template_over_the_source_bound_is_not_parsed_for_its_tool_features():
    """The engine reads a template's tool features when it starts, and a chat before rendering: parsing a GGUF's
    100 MB template held each for most of an hour."""
    head = "{{ tools }}<tool_call>{% if m.role == 'tool' %}{% endif %}"
    assert template_features(head + "{{ messages[0].content }}" * 20000) == TemplateFeatures()
    assert template_features(head + "{{ messages[0].content }}" * 20).uses_tools  # within the bound, it is read


def _reference(source: str, messages: list, **variables) -> str:
    """Jinja's own sandbox, unbounded, as transformers renders."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationBlock]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source).render(messages=messages, **variables)


LLAMA3 = (
    "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{%- if tools is not none %}"
    "{{- 'Environment: ipython\\n' }}{%- endif %}{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}{%- if 'tool_calls' in message %}"
    "{%- set tool_call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{{- '{\"name\": \"' + tool_call.name + '\", ' }}"
    "{{- '\"parameters\": ' }}{{- tool_call.arguments | tojson }}{{- '}' }}{{- '<|eot_id|>' }}"
    "{%- else %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim"
    " + '<|eot_id|>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
QWEN = (
    "{%- for message in messages %}{%- if loop.first and message.role != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{{- '<|im_start|>' ~ message.role ~ '\\n' ~ message.content ~ '<|im_end|>' ~ '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}{{ '%s|%5.2f|{:>4}'|format('x', 3.14159) }}{{ '{}:{:>3}'.format(1700000000, 'a') }}"
    "{{ 1700000000 * 3 }}{{ messages | map(attribute='role') | join(',') }}{{ 'ab' * 3 }}"
)


@pytest.mark.parametrize("template", [LLAMA3, GEMMA, QWEN, MISTRAL])
def test_real_templates_render_as_jinjas_own_sandbox_does(template):
    """5,000 turns (far past what a context holds) still render, as they did before the bounds."""
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f" turn {i} é 1700000000 "} for i in range(5000)
    ]
    variables = {"bos_token": "<s>", "eos_token": "</s>", "tools": None, "add_generation_prompt": True}
    expected = _reference(template, turns, **variables)
    assert render_chat_template(template, turns, **variables) == expected
    assert len(expected) > 5000 * 10


LOOPS = (
    "{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}{{ loop.revindex }}{{ loop.last }}"
    "{{ loop.previtem.content if loop.previtem is defined }}{{ loop.nextitem.role if loop.nextitem is defined }}"
    "{{ loop.cycle('a', 'b') }}{{ loop.changed(m.role) }}{% else %}none{% endfor %}"
    "{% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}={{ v }}{% endfor %}{% for x in nothing %}{% else %}E{% endfor %}"
    "{% for x in 'h\u00e9llo' %}{{ x ~ loop.index0 }}{% endfor %}{% for x in [[1, [2]], 3] recursive %}"
    "{% if x is iterable %}[{{ loop(x) }}]{% else %}{{ x }}@{{ loop.depth }}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.role }}{% endfor %}"
    "{% set s %}{{ 'a' ~ 1 }}{{ messages | length }}{% endset %}{{ s | upper }}{{ '%s-%d' | format('q', 3) }}"
    "{{ messages | map(attribute='content') | join('|') }}{{ messages | selectattr('role', 'equalto', 'user') | list }}"
)


def test_counted_loops_keep_what_loop_knows():
    """Each `{% for %}` iterates through the step counter: length, last, neighbours, filters, recursion, break,
    `~` and set blocks render as Jinja's own sandbox renders them."""
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
    ]
    expected = _reference(LOOPS, messages)
    assert "1/33False" in expected and "[1@2[2@3]]3@1" in expected
    assert render_chat_template(LOOPS, messages) == expected


BIG = '("F" * 7000) | int(base=16)'  # 28,000 bits: within MAX_DIGITS as the bound counts them (bits // 3)
HUGE = '{% set a = ("F" * 1000000) | int(base=16) %}{% set b = ("E" * 500000) | int(base=16) %}'
A, B = (1 << 4_000_000) - 1, (1 << 2_000_000) - 3  # as the int filter made them, or a caller's variables pass them


@pytest.mark.parametrize("expression", ["a // b", "a % b", "a - b", "b - a", "a / b", "-a", "+a", "1 // a", "a // 7"])
def test_an_operation_on_a_number_past_max_digits_is_refused_before_it_runs(expression):
    """`//` and `%` of a 4-million-bit number (made by the int filter from hex text) by a 2-million-bit one took 9 s
    in one step, before the step or time budget could stop it; `-`, `/` and the unary ops were not intercepted."""
    with pytest.raises(ChatTemplateError, match=r"stopped: a (unary )?\S+ on a number of over 10000 digits"):
        render_chat_template("{{ (" + expression + ") > 0 }}", HI, model="evil.gguf", a=A, b=B)


@pytest.mark.parametrize("expression", ["a is divisibleby b", "a // b", "[a, b] | sum"])
def test_the_int_filter_makes_no_number_past_max_digits(expression):
    """int(text, 16) is not bounded by Python's 4,300 digits: 1,000,000 hex digits made a 4-million-bit number, and
    `a is divisibleby b` (Python's % inside the test, past the sandbox's operators) then took 12.6 s in one step."""
    with pytest.raises(ChatTemplateError, match="stopped: the result of the filter int is a number of over 10000"):
        render_chat_template(HUGE + "{{ " + expression + " }}", HI, model="evil.gguf")


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f"-({BIG}) // 15 == -(({BIG}) // 15)", "True"),
        (f"({BIG}) % 15", "0"),
        ("-3 // 2", "-2"),
        ("+4 - 9", "-5"),
        ("7 / 2", "3.5"),
        ("messages[-1].content", "hi"),
    ],
)
def test_operations_within_max_digits_give_pythons_results(expression, expected):
    assert render_chat_template("{{ " + expression + " }}", HI, model="m") == expected
