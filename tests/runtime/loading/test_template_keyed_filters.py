"""Filters that read each item whole are charged that work before it runs: max, min, sort, unique, groupby and
dictsort lower each string they compare, and sum of lists copies its total so far at each item. Both ran in one step,
in C, past the render's 10 s deadline (`[big] * 2000 | max`: 44 s; `[many] * 1000 | sum(start=[])`: 35 s)."""

from __future__ import annotations

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from radixcache.runtime.loading.chat_template import ChatTemplateError, render_chat_template

HI = [{"role": "user", "content": "hi"}]
BIG = '{% set big = "a" * 10000000 %}{% set many = [1] * 2000 %}'


@pytest.mark.parametrize(
    "work",
    [
        "([big] * 1000) | max",
        "([big] * 1000) | min(case_sensitive=true)",
        "([big] * 1000) | select | max",
        "([big] * 1000) | sort",
        "([big] * 1000) | reverse | unique | list",
        "([{'a': big}] * 1000) | sort(attribute='a')",
        "([{'a': big}] * 1000) | groupby('a')",
        "([many] * 1000) | sum(start=[])",
        "([many] * 1000) | select | sum(start=[])",
        "([{'a': many}] * 1000) | sum(attribute='a', start=[])",
    ],
)
def test_a_filter_reading_every_item_whole_is_charged_its_work_before_it_runs(work):
    """Without the charge each ran 20 s or more in one step, then met the deadline (or the steps, in `length`)."""
    with pytest.raises(ChatTemplateError, match=r"stopped: it ran past 1000000 steps"):
        render_chat_template(BIG + "{{ (" + work + ") | first }}", HI, model="evil.gguf")


def test_keyed_filters_of_real_size_render_as_jinja_renders_them():
    template = (
        "{{ [[1, 2], [3]] | sum(start=[]) }}|{{ ['b', 'A', 'c'] | max }}|{{ ['b', 'A', 'c'] | sort | join }}"
        "|{{ {'b': 1, 'a': 2} | dictsort }}|{{ [3, 1, 2] | select | max }}|{{ ['x', 'X', 'y'] | unique | list }}"
        "|{{ messages | sort(attribute='role') | map(attribute='content') | join }}|{{ [1, 2] | sum }}"
        "|{{ messages | groupby('role') | map(attribute='grouper') | list }}|{{ [(1,), (2,)] | sum(start=()) }}"
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    assert render_chat_template(template, messages) == env.from_string(template).render(messages=messages)
