"""The sandbox's bounds are wired in as a template compiles (template_sandbox.py): `+` chains joined at once, loops
charged as they start, the budget on the render's eval context. Each renders as Jinja's own sandbox does, and each
way around a bound that the rewiring could open is still refused."""

from __future__ import annotations

import threading

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from radixcache.runtime.loading import template_bounds
from radixcache.runtime.loading.chat_template import ChatTemplateError, _raise_exception, _tojson, render_chat_template
from radixcache.runtime.tools.features import GenerationBlock

HI = [{"role": "user", "content": "hi"}]
LONG_CHAIN = "{% for i in range(10000) %}{{ " + " + ".join(["'a'"] * 200) + " }}{% endfor %}"


def _reference(source: str, messages: list, **variables) -> str:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationBlock]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source).render(messages=messages, **variables)


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'a' + 'b' + messages[0].content + 'c' }}|{{ 1 + 2 + 3 }}|{{ [1] + [2] + [3] }}|{{ (1, 2) + (3,) }}",
        "{{ 'a' + ('b' + 'c') + 'd' }}|{{ 1.5 + 2 }}|{{ true + 1 }}|{{ 'x' ~ 1 + 2 ~ 'y' }}",
        "{{ ('<' | safe) + '<' + '>' }}|{{ '<' + ('<' | safe) }}|{{ ('<' | e) + '&' }}",  # Markup escapes its other
        "{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s + m.role + ',' %}{% endfor %}"
        "{{ ns.s }}{{ (messages | map(attribute='role') | list) + ['end'] }}",
        "{% macro m(x) %}<{{ x + '!' }}>{% endmacro %}{{ m('a') + m('b') }}"
        "{% macro w() %}[{{ caller() + '|' }}]{% endmacro %}{% call w() %}{{ 'c' + 'd' }}{% endcall %}"
        "{% set blk %}{{ m('d') }}{% endset %}{{ blk + blk }}{% filter upper %}{{ 'e' + 'f' }}{% endfilter %}",
        "{% block b %}[{{ messages | length }}]{% endblock %}{{ self.b() + self.b() }}",
        "{% for x in 'abc' %}{{ x }}{% endfor %}{% for k in {'p': 1, 'q': 2} %}{{ k }}{% endfor %}"
        "{% for x in (1, 2) %}{{ x }}{% endfor %}{% for i in range(3) %}{% if i == 1 %}{% break %}{% endif %}"
        "{{ i }}{% endfor %}{% for x in [] %}{% else %}empty{% endfor %}",
    ],
)
def test_bounded_operators_and_loops_render_as_jinjas_sandbox(template):
    """`+` chains go through one `plus` (strings joined at once, anything else pair by pair as `+` adds, Markup's
    escaping kept), loops over a list, string, dict, tuple or range are iterated as they are."""
    messages = [{"role": "user", "content": "<u>"}, {"role": "assistant", "content": "a"}]
    expected = _reference(template, messages)
    assert render_chat_template(template, messages) == expected


@pytest.mark.parametrize(
    "template",
    ["{{ 1 + 'a' + 'b' }}", "{{ 'a' + 'b' + 1 }}", "{{ none + 'a' }}", "{{ [1] + 'a' }}"],
)
def test_a_plus_of_mismatched_types_fails_as_pythons_does(template):
    with pytest.raises(ChatTemplateError, match="failed: TypeError"):
        render_chat_template(template, HI)


@pytest.mark.parametrize(
    ("template", "bound"),
    [
        # {% autoescape %} saves and restores its eval context's attributes: the budget is not refunded by it
        (
            "{% for i in range(100000) %}{% autoescape false %}{% for j in range(100000) %}{% endfor %}"
            "{% endautoescape %}{% endfor %}",
            "steps",
        ),
        # a block rendered through `self` is joined by the environment's concat
        ('{% set big = "a" * 9000000 %}{% block b %}{{ big }}{{ big }}{% endblock %}{{ self.b() | length }}', "block"),
        ('{% set big = "a" * 9000000 %}{% macro m() %}{{ big }}{{ big }}{% endmacro %}{{ m() | length }}', "block"),
        ('{% set big = "a" * 9000000 %}{% set x %}{{ big }}{{ big }}{% endset %}{{ x | length }}', "block"),
        # a chain counts each of its `+`: 200 of them an iteration, 2,000,000 in all
        pytest.param(LONG_CHAIN, "steps", id="a-chain-of-200-plus"),
        ('{% set a = "a" * 6000000 %}{{ (a + a + a) | length }}', "concatenation"),
        ("{% set a = ['a'] * 6000000 %}{{ (a + a + a) | length }}", "in all"),
        # a loop too long for the steps left is counted item by item, and refused as it passes the bound
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"),
    ],
)
def test_the_rewired_bounds_still_stop_a_hostile_template(template, bound):
    """Each would be a way past a bound that the old sandbox held: a refund, a join outside `call`, a chain's
    `+` counted once."""
    with pytest.raises(ChatTemplateError, match=r"chat template of evil\.gguf was stopped: .*" + bound):
        render_chat_template(template, HI, model="evil.gguf")


def test_a_loop_that_breaks_early_is_charged_only_what_it_ran_when_it_is_long():
    """Twenty loops over range(100000) that break at once are 20 steps, not 2,000,000: a loop longer than the
    sandbox charges at its start is counted as it runs."""
    template = "{% for k in range(20) %}{% for i in range(100000) %}{{ i }}{% break %}{% endfor %}{% endfor %}"
    assert render_chat_template(template, HI) == "0" * 20


def test_each_render_has_its_own_budget_in_any_thread():
    """A render of 600,000 steps, twice in a row and in four threads at once: each its own budget (a shared one
    would refuse the second), while a hostile render beside them is stopped alone."""
    heavy = "{% for i in range(60) %}{% for j in range(10000) %}{% endfor %}{% endfor %}done"
    assert render_chat_template(heavy, HI) == render_chat_template(heavy, HI) == "done"
    results: list[str] = []

    def run(source: str) -> None:
        try:
            results.append(render_chat_template(source, HI))
        except ChatTemplateError as e:
            results.append(str(e))

    threads = [threading.Thread(target=run, args=(heavy,)) for _ in range(4)]
    threads.append(threading.Thread(target=run, args=(heavy.replace("range(60)", "range(100000)"),)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results)[:4] == ["done"] * 4 and "ran past 1000000 steps" in sorted(results)[4]


@pytest.mark.parametrize(
    "template",
    [
        "{{ '{{x}}{}'.format(1700000000) }}|{{ '{{}}{:>5}'.format('a') }}|{{ '{0}{{{1}}}'.format(1, 1700000000) }}",
        "{{ 'call 123456789: {}'.format(1) }}|{{ '%s at 1700000000' % 'x' }}|{{ '99999999 %s' | format('y') }}",
        "{{ '100%% of {}'.format(2) }}|{{ '%d%%' % 50 }}|{{ '{:>{}}|{:.{}f}'.format('a', 4, 3.14159, 2) }}",
        "{{ '{a:>{w}}'.format_map({'a': 'x', 'w': 6}) }}|{{ '%(n)s=%(v)5.1f' % {'n': 'pi', 'v': 3.14159} }}",
    ],
)
def test_format_strings_count_only_their_fields_widths(template):
    """`"{{x}}{}".format(big)` was refused: the literal `{{` read as a nested field's brace, so a timestamp passed
    to it was taken for a width; so were numbers in a format's text. Only a field's (or a %-spec's) own width and
    precision count, as Python applies them."""
    assert render_chat_template(template, HI) == _reference(template, HI)


@pytest.mark.parametrize(
    "template",
    [
        "{{ '{0:>{1[0]}}'.format(1, [10**10]) }}",  # a width from an item of an argument
        "{{ '{a:>{w}}'.format_map({'a': 1, 'w': 10**10}) }}",  # from format_map's mapping
        "{{ '{:{}{}}'.format('a', '>', 10**10) }}",
        "{{ '{:.{}}'.format('a', 10**9) }}",
        "{{ '%-1000000000s' % 'a' }}",
        "{{ '%(a)1000000000s' % {'a': 1} }}",
        "{{ '%.*f' % (10**9, 1.5) }}",
    ],
)
def test_a_width_from_anywhere_in_a_format_is_still_refused(template):
    with pytest.raises(ChatTemplateError, match=r"stopped: .*(width or precision|was passed) .*1000000000"):
        render_chat_template(template, HI, model="evil.gguf")


@pytest.mark.parametrize(
    "template",
    [
        "{% for i in range(100000) %}{% endfor %}",  # counted as it runs
        "{% for i in range(2) %}{% for j in range(60000) %}{% endfor %}{% endfor %}",  # charged as each starts
        "{% for i in range(3000) %}{{ ('ab' * 100) | upper }}{% endfor %}",  # steps of calls and operators
    ],
)
def test_a_render_past_its_deadline_is_stopped_naming_it(template, monkeypatch):
    """The step bound counts work, not time: `("中" * 1000000) | map("upper") | list` ran 18 s before its millionth
    step. Every render has a wall-clock deadline, checked every 1,024 steps; here it is set to 0 s, so the first
    check stops the render, whichever way its steps are spent."""
    monkeypatch.setattr(template_bounds, "MAX_SECONDS", 0.0)
    with pytest.raises(ChatTemplateError, match=r"evil\.gguf was stopped: it ran past its deadline of 0 s"):
        render_chat_template(template, HI, model="evil.gguf")
    monkeypatch.setattr(template_bounds, "MAX_SECONDS", 10.0)  # a fresh deadline for each render
    assert render_chat_template(template + "ok", HI).endswith("ok")


def test_lipsum_is_charged_its_words_before_it_runs():
    """`lipsum(100000)` (Jinja's global) was one call, one step, and held the thread 22 s; its words are now
    charged before it runs. A few paragraphs still render."""
    with pytest.raises(ChatTemplateError, match=r"evil\.gguf was stopped: it ran past 1000000 steps"):
        render_chat_template("{{ lipsum(100000) | length }}", HI, model="evil.gguf")
    with pytest.raises(ChatTemplateError, match=r"stopped: lipsum was passed 100000000000"):
        render_chat_template("{{ lipsum(2, max=10**11) | length }}", HI, model="evil.gguf")
    assert render_chat_template("{{ lipsum(3, html=false, min=5, max=9).count('\\n\\n') }}", HI) == "2"


def test_a_chain_of_filter_generators_is_counted_a_step_an_item(monkeypatch):
    """`range(100000) | select("odd") | select("odd") ... | list` is three calls, but every item passes every
    `select` inside the one `list`: 100 of them ran 32 s before the deadline was first looked at (one per 14
    characters of a 256 KB template: hours). Each item a filter's generator yields is a step now, so the step bound
    stops such a chain, and the deadline is checked while it drains."""
    chain = "{{ range(100000)" + ' | select("odd")' * 21 + " | list | length }}"
    with pytest.raises(ChatTemplateError, match=r"evil\.gguf was stopped: it ran past 1000000 steps"):
        render_chat_template(chain, HI, model="evil.gguf")
    monkeypatch.setattr(template_bounds, "MAX_SECONDS", 0.0)
    with pytest.raises(ChatTemplateError, match=r"evil\.gguf was stopped: it ran past its deadline of 0 s"):
        render_chat_template('{{ range(100000) | select("odd") | list | length }}', HI, model="evil.gguf")
    monkeypatch.setattr(template_bounds, "MAX_SECONDS", 10.0)
    assert render_chat_template('{{ range(10) | select("odd") | map("string") | join(",") }}', HI) == "1,3,5,7,9"
