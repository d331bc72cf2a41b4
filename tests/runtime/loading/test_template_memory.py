"""What a chat template would make is refused before it is made: a list of a string's characters, a split's pieces,
a repetition or concatenation past what is left of the render's bound. Before, each was made (GBs for some) and only
then refused; the peak of what the render allocated (tracemalloc) shows which."""

from __future__ import annotations

import tracemalloc

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from radixcache.runtime.loading.chat_template import ChatTemplateError, _raise_exception, _tojson, render_chat_template
from radixcache.runtime.tools.features import GenerationBlock

HI = [{"role": "user", "content": "hi"}]
MB = 1 << 20


def _peak_of_refusal(template: str, match: str) -> int:
    """The most bytes Python held while rendering `template` was refused with a message matching `match`."""
    tracemalloc.start()
    try:
        with pytest.raises(ChatTemplateError, match=match):
            render_chat_template(template, HI, model="evil.gguf")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("template", "source_mb", "bound"),
    [
        ('{{ ("中" * 16000000) | list | length }}', 32, "the filter list would take"),  # was 1.4 GB, 14 s
        ('{{ ("ab " * 5000000).split() | length }}', 15, "str.split would take"),  # was 650 MB
        ('{{ ("a\\n" * 8000000).splitlines() | length }}', 16, "str.splitlines would take"),
        ('{{ ("a," * 8000000).rsplit(",") | length }}', 16, "str.rsplit would take"),
        ('{{ (["a"] * 10000000) | length }}', 0, "a repetition would take"),  # was 80 MB
        ('{% set a = ["a"] * 5000000 %}{{ (a + a) | length }}', 40, "a concatenation would take"),
        ('{{ ("中" * 16000000) | batch(1) | list | length }}', 32, "steps"),  # was 2.8 GB, 47 s
        ('{{ ("ab" * 8000000) | unique | list | length }}', 16, "steps"),  # was 14 s
        ('{{ ("中" * 4000000) | sort | length }}', 8, "steps"),
    ],
)
def test_what_a_template_would_make_is_refused_before_it_is_made(template, source_mb, bound):
    peak = _peak_of_refusal(template, r"evil\.gguf was stopped: .*" + bound)
    assert peak < (source_mb + 40) * MB, f"{peak / MB:.0f} MB allocated for a string of {source_mb} MB"


def _reference(source: str, messages: list) -> str:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationBlock]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source).render(messages=messages)


def test_splits_and_lists_of_real_size_render_as_jinja_renders_them():
    template = (
        "{% for m in messages %}{{ m.content.split() | length }},{{ m.content.split(' ', 2) }},"
        "{{ m.content.rsplit('é', 1) }},{{ m.content.splitlines() }},{{ m.content | list | length }},"
        "{{ m.content | unique | list | length }},{{ (m.content.split() * 3) | length }}|{% endfor %}"
        "{{ (messages + messages) | length }}{{ messages | map(attribute='role') | sort | join }}"
    )
    messages = [
        {"role": "user", "content": "héllo wörld\nsecond line 中文 " * 200},
        {"role": "assistant", "content": "a b c\r\nd"},
    ]
    assert render_chat_template(template, messages) == _reference(template, messages)


@pytest.mark.parametrize(
    ("template", "bound"),
    [
        ('{{ (["a"] * 400000) | join("x" * 1000) | length }}', "join would make"),
        ('{{ ("x" * 1000).join(["a"] * 400000) | length }}', "join would make"),
        ('{{ ("a\\n" * 1000000) | indent(100) | length }}', "indent would make"),
        ('{{ ("a\\n" * 1000000) | indent(width=" " * 100) | length }}', "indent would make"),
        ('{{ ("\\t" * 1000000).expandtabs(100) | length }}', "expandtabs would make"),
        ('{{ ("\\t" * 1000000).expandtabs(tabsize=100) | length }}', "expandtabs would make"),
        ('{{ ("a" * 1000000).translate({97: "x" * 100}) | length }}', "translate would make"),
    ],
)
def test_a_string_grown_by_a_separator_width_or_table_is_refused_before_it_is_made(template, bound):
    """Each made a string of 100 to 400 M characters before the result's check refused it: the separator, the indent's
    width, the tab size or the translation's string counted only once, not once per item, line, tab or character."""
    peak = _peak_of_refusal(template, r"evil\.gguf was stopped: .*" + bound)
    assert peak < 60 * MB, f"{peak / MB:.0f} MB allocated"


def test_joins_indents_tabs_and_translations_of_real_size_render_as_jinja_renders_them():
    template = (
        "{{ messages | map(attribute='content') | join(', ') }}|{{ ', '.join(['a', 'b']) }}|{{ 'a\\nb' | indent(2) }}"
        "|{{ 'a\\nb\\n' | indent(width='> ', first=true, blank=true) }}|{{ 'a\\tb'.expandtabs() }}"
        "|{{ 'a\\tb'.expandtabs(tabsize=3) }}|{{ 'abc'.translate({97: 'xy', 98: none}) }}"
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert render_chat_template(template, messages) == _reference(template, messages)


@pytest.mark.parametrize(
    "template",
    [
        "{{ (range(1000) | list) | tojson(indent=100000) | length }}",
        "{{ [[range(100) | list] * 10] | tojson(indent=' ' * 20000) | length }}",
        "{{ (range(1000) | list) | tojson(separators=(',' * 100000, ':')) | length }}",
        "{{ {'a': range(1000) | list} | tojson(false, 100000) | length }}",  # transformers' order: ensure_ascii, indent
    ],
)
def test_tojson_is_sized_with_its_indent_and_separators_before_it_writes(template):
    """An indent or a separator is written again for every item (and the indent once per level of depth): each
    made 100 M characters or more before the result's check refused it."""
    peak = _peak_of_refusal(template, r"evil\.gguf was stopped: the filter tojson would write over")
    assert peak < 60 * MB, f"{peak / MB:.0f} MB allocated"


def test_tojson_of_real_tools_renders_as_jinja_renders_it():
    template = (
        "{{ tools | tojson }}|{{ tools | tojson(indent=4) }}|{{ tools[0] | tojson(separators=(',', ':')) }}"
        "|{{ tools | tojson(true, 2) }}|{{ tools | tojson(indent='\\t', sort_keys=true) }}"
    )
    tools = [{"role": "x", "type": "function", "function": {"name": "f", "parameters": {"x": [1, "é"]}}}]
    expected = _reference(template.replace("tools", "messages"), tools)
    assert render_chat_template(template.replace("tools", "messages"), tools) == expected


def test_a_whitespace_split_counts_the_pieces_it_made_not_its_bound():
    """A split on whitespace is bounded before it runs by its string's whitespace characters, and counted by the
    pieces it made: eight splits of a 500 K-character message (100,000 words, 7.2 M each) fit the 64 Mi, where
    counting each split's bound as half the length (250,000 pieces) refused the eighth, and the bound itself, not
    the pieces made, the fifth."""
    template = "{% for i in range(8) %}{{ messages[0].content.split() | length }},{% endfor %}"
    messages = [{"role": "user", "content": "word pair " * 50000}]
    assert render_chat_template(template, messages) == "100000," * 8
