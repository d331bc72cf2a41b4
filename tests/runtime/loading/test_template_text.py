"""A list or dict a template writes as text is sized before it is written: `[big] * 1000` holds 1,000 pointers to
one 16 Mi string (8 KB as the sandbox counts it) but writes 16 G characters, wherever it is written."""

from __future__ import annotations

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from radixcache.runtime.loading.chat_template import ChatTemplateError, _raise_exception, _tojson, render_chat_template
from radixcache.runtime.tools.features import GenerationBlock

HI = [{"role": "user", "content": "hi"}]
BIG = '{% set big = "a" * 10000000 %}{% set many = [big] * 1000 %}'


@pytest.mark.parametrize(
    "write",
    [
        "{{ many }}",
        "{{ many | tojson }}",
        "{{ many | string | length }}",
        "{{ many | upper | length }}",
        "{{ 'x' ~ many }}",
        "{{ '%s' % (many,) }}",
        "{{ '%s' | format(many) }}",
        "{{ '{}'.format(many) }}",
        "{{ [many] | join }}",
        "{{ {'k': many} }}",
        "{{ ({'k': many}).items() | list | tojson }}",
        "{% set ns = namespace(m=many) %}{{ ns }}",
        "{{ (['x'] + many) }}",
        "{% if many is lower %}{% endif %}",
        "{{ raise_exception(many) }}",
        "{% set t %}{{ many }}{% endset %}",
        "{{ many | pprint | length }}",
    ],
)
def test_a_structure_written_as_text_is_sized_before_it_is_written(write):
    """Each took 16 GB or ran out of memory (transformers renders them the same)."""
    with pytest.raises(ChatTemplateError, match=r"evil\.gguf was stopped: .*over 16777216 characters as text"):
        render_chat_template(BIG + write, HI, model="evil.gguf")


def test_a_shared_structure_walked_past_the_steps_left_is_refused():
    """Nested sharing (`[[x] * 1000] * 1000`) writes little text per item but is a million items to walk."""
    template = "{% set m = [['a'] * 1000] * 1100 %}{{ m | tojson | length }}"
    with pytest.raises(ChatTemplateError, match=r"stopped: .*(steps|as text)"):
        render_chat_template(template, HI, model="evil.gguf")


def _reference(source: str, messages: list, **variables) -> str:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationBlock]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source).render(messages=messages, **variables)


def test_structures_of_real_size_are_written_as_jinja_writes_them():
    template = (
        "{{ messages }}|{{ messages | tojson }}|{{ tools | tojson(indent=2) }}|{{ messages[0] }}|{{ 1.5 }}|{{ none }}"
        "|{{ [1, (2, 3), {'a': (4,)}] }}|{{ ({'a': 1}).items() }}|{{ ({'a': 1}).keys() | list }}|{{ 'x' ~ [1] }}"
        "|{{ '%s-%s' % ([1], {'b': 2}) }}|{{ '{}'.format([3]) }}|{{ [messages] | join(',') }}|{{ 2 ** 100 }}"
        "|{% set ns = namespace(a=[1]) %}{{ ns.a }}|{{ [1] + [2] }}|{{ messages | upper }}|{{ true }}"
        "|{{ strftime_now('%Y') | length }}{% if messages is lower %}L{% endif %}"
    )
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "hi é"}, {"role": "assistant", "content": "x"}]
    expected = _reference(template, messages, tools=tools, strftime_now=lambda fmt: "2026")
    assert render_chat_template(template, messages, tools=tools) == expected


def test_strftime_now_with_a_format_that_writes_too_much_is_refused():
    with pytest.raises(ChatTemplateError, match=r"stopped: strftime_now's format of 8000000 characters"):
        render_chat_template("{{ strftime_now('%c' * 4000000) | length }}", HI, model="evil.gguf")


@pytest.mark.parametrize("lazy", ["select", "reverse", "reject('none')"])
def test_a_join_of_a_generator_is_sized_before_it_is_made(lazy):
    """`[big] * 30 | select | join` made its 300 M-character string before its size was checked (1,000 of them:
    10 GB); a list's join was refused before it ran, a generator's was not sized at all."""
    template = '{% set big = "a" * 10000000 %}{{ ([big] * 30) | ' + lazy + " | join | length }}"
    with pytest.raises(ChatTemplateError, match=r"stopped: join would make a string over 16777216 characters"):
        render_chat_template(template, HI, model="evil.gguf")


def test_joins_of_generators_of_real_size_render_as_jinja_renders_them():
    template = (
        "{{ range(5) | map('string') | join('-') }}|{{ ['a', 'b'] | reverse | join }}|{{ {'k': 1} | join }}"
        "|{{ messages | selectattr('role') | join(',', attribute='content') }}|{{ [[1], 'x'] | select | join }}"
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert render_chat_template(template, messages) == _reference(template, messages)
