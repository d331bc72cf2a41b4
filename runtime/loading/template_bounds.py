"""Bounds on rendering a chat template: a model file's template (a GGUF from a hub) or `chat_template=` runs in this
sandbox (template_sandbox.py), so a hostile one (`{% for i in range(100000) %}{% for j in range(100000) %}{% endfor
%}{% endfor %}`, `{{ "a" * 10**10 }}`) is refused with an error instead of holding a thread or taking many GB.

Every loop iteration, operator and call is a step of the render's budget (`MAX_STEPS`; a macro call `MACRO_STEPS`),
and a render that runs past `MAX_SECONDS` (checked every `CHECK_EVERY` steps) is stopped however few its steps;
no string or list it makes, and not its output, may hold more than `MAX_CHARS` characters (items), nor an integer
`MAX_DIGITS` digits:
`*`, `**`, `+`, `~`, `%`, widths and counts passed to a call or filter are checked before they allocate (the
operands of `-`, `/`, `//`, `%` and unary `-`, `+` before they run), every
call's and filter's result after, and all it makes together is bounded by `MAX_MADE`. Real templates take some
steps a message (about 7 for ChatML, 16 for Llama 3's) and make nothing near the size bounds.

The budget is the render's own (`Budget`, on its context's eval context, which Jinja shares with every context
derived from it), so the checks find it by an attribute, not a lookup. The bounds of concatenations and of the
output (`+`, `~`, a block's text, the render's output) are template_concat.py's."""

from __future__ import annotations

import re
import time
from collections.abc import ItemsView, Iterable, Iterator, KeysView, ValuesView
from typing import Any

from jinja2.utils import Namespace

from radixcache.runtime.tools.features import MAX_TEMPLATE_CHARS

MAX_SOURCE = MAX_TEMPLATE_CHARS  # a template's characters (tools/features.py, which does not read a longer one)
MAX_STEPS = 1_000_000  # about 0.3 to 3 s, as a step's work goes
MACRO_STEPS = 32  # a macro call costs about as much time as this many loop iterations
MAX_CHARS = 1 << 24  # 16 Mi characters: far past any model's context, far below a machine's memory
MAX_MADE = 4 * MAX_CHARS  # what all its results hold together, each counted when made
ITEM_WEIGHT = 8  # a list's, tuple's or dict's item counts as this many characters: its pointer
OBJECT_WEIGHT = 64  # and a string made for each item (a split's, a non-ASCII string's characters) this many more
MAX_DIGITS = 10_000  # an integer's: str() writes at most 4,300, and multiplying huge ones takes minutes
MAX_SECONDS = 10.0  # a render's wall-clock deadline, checked at steps: real templates take milliseconds
CHECK_EVERY = 1024  # steps between the budget's slow checks (the clock's among them)
LOOP_UPFRONT = 1 << 16  # a loop over at most this many items is charged them all as it starts
SMALL_INT = 1 << 62  # ints below this in size multiply, add and take % without a digits check


class TemplateBoundError(Exception):
    """A render went past a bound; chat_template.py turns it into a ChatTemplateError naming the template."""


class Budget:
    """One render's steps, characters left and deadline. The hot paths inline `spend`: `steps -= n`, and the slow
    `tick` (the steps' bound, the clock) only once `steps` falls below `mark`, every CHECK_EVERY steps."""

    __slots__ = ("deadline", "made", "mark", "steps")

    def __init__(self) -> None:
        self.steps = MAX_STEPS
        self.made = MAX_MADE
        self.mark = MAX_STEPS - CHECK_EVERY
        self.deadline = time.monotonic() + MAX_SECONDS

    def spend(self, cost: int) -> None:
        self.steps -= cost
        if self.steps < self.mark:
            self.tick()

    def tick(self) -> None:
        if self.steps < 0:
            raise TemplateBoundError(f"it ran past {MAX_STEPS} steps (loop iterations, calls, a filter's work)")
        if time.monotonic() > self.deadline:
            raise TemplateBoundError(f"it ran past its deadline of {MAX_SECONDS:g} s (slow work in few steps)")
        self.mark = max(self.steps - CHECK_EVERY, 0)

    def hold(self, size: int) -> None:
        self.made -= size
        if self.made < 0:
            raise TemplateBoundError(f"its results hold over {MAX_MADE} characters or items in all")


def budget_of(context: Any) -> Budget:
    """The render's budget (template_sandbox.BoundedTemplate puts it on the context's eval context)."""
    return context.eval_ctx.budget  # type: ignore[no-any-return]


_NUMBER = re.compile(r"\d+")
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?.", re.DOTALL)  # width, precision


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def size_of(value: Any) -> int:
    """A string's or bytes' characters, a list's, tuple's or dict's items, an integer's digits (a little over)."""
    if isinstance(value, str | bytes | list | tuple | dict):
        return len(value)
    return value.bit_length() // 3 if _is_int(value) else 0


def check_digits(value: Any, what: str) -> None:
    """Refuses an integer operand of over MAX_DIGITS digits (`//` or `%` of 4 million bits took 9 s in one step)."""
    if _is_int(value) and value.bit_length() // 3 > MAX_DIGITS:
        raise TemplateBoundError(f"{what} on a number of over {MAX_DIGITS} digits")


def check(value: Any, what: str, budget: Budget) -> Any:
    """`value`, made by the template: no larger than MAX_CHARS, and counted against the render's MAX_MADE."""
    cls = type(value)
    if cls is str:  # the common case first
        size = weight = len(value)
    elif cls is list or cls is tuple or cls is dict or isinstance(value, list | tuple | dict):
        size = len(value)
        weight = size * ITEM_WEIGHT
    else:
        size = weight = size_of(value)
        if size > MAX_DIGITS and _is_int(value):  # int(hex text, 16) made 48 million bits: `is divisibleby` 12 s
            raise TemplateBoundError(f"{what} is a number of over {MAX_DIGITS} digits")
    if size > MAX_CHARS:
        raise TemplateBoundError(f"{what} is over {MAX_CHARS} characters or items")
    budget.made -= weight
    if budget.made < 0:
        raise TemplateBoundError(f"its results hold over {MAX_MADE} characters or items in all")
    return value


def text_size(value: Any, what: str, budget: Budget | None = None) -> int:
    """About the characters `str(value)` (or its JSON) writes, walked without writing it: a string's own, an
    integer's digits, each item of a list, tuple, set, dict or dict view and a namespace's attributes with their
    punctuation (an item as often as it appears: `[big] * 1000` writes `big` 1,000 times), 24 for anything else.
    Refused once over MAX_CHARS; the walk is a step an item (at most the steps left)."""
    cls = value.__class__
    if cls is str:
        return len(value)  # type: ignore[no-any-return]
    if cls is int or cls is bool or cls is float or value is None:
        return value.bit_length() // 3 + 2 if cls is int else 24  # type: ignore[no-any-return]
    limit = budget.steps if budget is not None else MAX_STEPS
    total = walked = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 2
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            walked += len(item)
            stack += item.keys()
            stack += item.values()
        elif isinstance(item, list | tuple | set | frozenset | KeysView | ValuesView | ItemsView):
            total += 2 + 2 * len(item)
            walked += len(item)
            stack += item
        elif isinstance(item, Namespace):
            stack.append(item._Namespace__attrs)  # type: ignore[attr-defined]  # its repr writes them
        else:
            total += 24
        if total > MAX_CHARS:
            raise TemplateBoundError(f"{what} would be over {MAX_CHARS} characters as text")
        if walked > limit:
            raise TemplateBoundError(f"it ran past {MAX_STEPS} steps (loop iterations, calls, a filter's work)")
    if budget is not None:
        budget.spend(walked)
    return total


def text_of(value: Any, what: str, budget: Budget | None = None) -> str:
    """`str(value)`, its size checked before it is written."""
    text_size(value, what, budget)
    return str(value)


def shown(context: Any, value: Any) -> Any:
    """`value`, about to be written to the output as text (`{{ x }}`): a list or dict no larger than MAX_CHARS."""
    if value.__class__ is not str:
        text_size(value, "an output", context.eval_ctx.budget)
    return value


def check_ints(args: Iterable[Any], what: str) -> None:
    for a in args:
        if _is_int(a) and abs(a) > MAX_CHARS:
            raise TemplateBoundError(f"{what} was passed {a}, over {MAX_CHARS}")


def check_percent(fmt: Any, args: Any, what: str) -> None:
    """A %-format string's widths and precisions (`%01000000000d`), and one it takes from `args` (`%*d`): only its
    conversion specs count, not numbers in its text (`"id 123456789: %s"`)."""
    if not isinstance(fmt, str) or "%" not in fmt:
        return
    star = False
    for spec in _PERCENT_SPEC.finditer(fmt):
        for n in spec.groups():
            if n == "*":
                star = True
            elif n is not None and len(n) >= 8 and int(n) > MAX_CHARS:
                raise TemplateBoundError(f"{what} has a width or precision of {n}, over {MAX_CHARS}")
    if star:
        check_ints(args if isinstance(args, tuple | list) else [args], what)


def check_spec(spec: str, what: str) -> None:
    """A {}-format field's spec as it is applied (a width from the arguments, `{:>{}}`, already in it): its width
    and precision."""
    for n in _NUMBER.findall(spec):
        if len(n) >= 8 and int(n) > MAX_CHARS:
            raise TemplateBoundError(f"{what} has a width or precision of {n}, over {MAX_CHARS}")


def check_replace(s: str, old: str, new: str, count: int = -1) -> None:
    n = s.count(old) if old else len(s) + 1
    if count >= 0:
        n = min(n, count)
    if len(s) + n * max(len(new) - len(old), 0) > MAX_CHARS:
        raise TemplateBoundError(f"replace would make a string over {MAX_CHARS} characters")


def check_join(items: Any, sep: Any = "") -> None:
    """A join's size: its items' and its separator's between them (`(["a"] * 1000000) | join("x" * 100)`)."""
    if isinstance(items, list | tuple):
        between = max(len(items) - 1, 0) * len(sep) if isinstance(sep, str) else 0
        if between + sum(len(x) for x in items if isinstance(x, str)) > MAX_CHARS:
            raise TemplateBoundError(f"join would make a string over {MAX_CHARS} characters")


def check_grown(text: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """What str.expandtabs and str.translate, and the filter indent, write, bounded before they run: a tab (a
    line, for indent) becomes up to the width given, a character a translation table's longest string."""
    width = args[0] if args else next(iter(kwargs.values()), 8 if name == "expandtabs" else 4)
    if name == "translate":
        table = width if isinstance(width, dict) else {}
        longest = max((len(v) for v in table.values() if isinstance(v, str)), default=1)
        size = len(text) * longest
    elif isinstance(width, str):  # indent's width may be a string to put before each line
        size = len(text) + (text.count("\n") + 1) * len(width)
    elif _is_int(width):
        size = len(text) + (text.count("\t" if name == "expandtabs" else "\n") + 1) * max(width, 0)
    else:
        return
    if size > MAX_CHARS:
        raise TemplateBoundError(f"{name} would make a string of up to {size} characters, over {MAX_CHARS}")


def work(value: Any) -> int:
    """Steps for C-speed work over `value` (a search, a copy, a count): a step per 64 characters of a string, a step
    an item of a list, tuple or dict, nothing for anything else."""
    if isinstance(value, str):
        return len(value) >> 6
    if isinstance(value, list | tuple | dict):
        return len(value)
    return 0


def counted(budget: Budget, iterable: Any) -> Iterator[Any]:
    """`iterable`, a step an item it yields."""
    for item in iterable:
        budget.steps -= 1
        if budget.steps < budget.mark:
            budget.tick()
        yield item


def steps_of(context: Any, iterable: Any) -> Any:
    """A `{% for %}`'s iterable. A list, tuple, dict, string or range of at most LOOP_UPFRONT items is charged them
    all as it starts (and iterated as it is: no step per item; a loop that breaks early has spent them all the
    same); a longer one, one past the steps left, or anything else (a generator, a filter's) a step an item as it
    yields them."""
    budget = context.eval_ctx.budget
    cls = type(iterable)
    if cls is list or cls is tuple or cls is dict or cls is str or cls is range:
        n = len(iterable)
        if n <= LOOP_UPFRONT and n <= budget.steps:
            budget.steps -= n
            if budget.steps < budget.mark:
                budget.tick()
            return iterable
    return counted(budget, iterable)


def searched(context: Any, container: Any) -> Any:
    """`container`, the right side of a comparison or `in` or a sliced value, its work counted."""
    budget = context.eval_ctx.budget
    budget.steps -= work(container)
    if budget.steps < budget.mark:
        budget.tick()
    return container


def fits(budget: Budget, weight: int, what: str) -> None:
    """Refuses, before it is made, what would take the render past MAX_MADE (`check` counts it once made)."""
    if weight > budget.made:
        raise TemplateBoundError(f"{what} would take its results over {MAX_MADE} characters or items in all")


_WHITESPACE = "".join(c for c in map(chr, range(0x3001)) if c.isspace())  # where str.split() splits (25 of them)
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines splits


def split_count(text: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """At most how many strings `text.split(...)`, `rsplit` or `splitlines` makes, counted before it runs (each a
    new object: `("ab " * 5000000).split()` took 650 MB before its result was checked): a separator's count, the
    line breaks, or the whitespace characters for a split on whitespace."""
    if name == "splitlines":
        return sum(map(text.count, _LINE_BREAKS)) + 1
    sep = args[0] if args else kwargs.get("sep")
    n = text.count(sep) + 1 if isinstance(sep, str) and sep else sum(map(text.count, _WHITESPACE)) + 1
    limit = args[1] if len(args) > 1 else kwargs.get("maxsplit", -1)
    return min(n, limit + 1) if _is_int(limit) and limit >= 0 else n
