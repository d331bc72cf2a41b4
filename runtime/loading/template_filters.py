"""The sandbox's filters and tests (template_sandbox.py installs them): each a wrapper that counts its work as
steps, checks its widths, counts and text before it runs and its result after (template_bounds.py)."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable
from typing import Any

from jinja2.filters import make_attrgetter
from jinja2.utils import _PassArg, generate_lorem_ipsum, pass_context

from radixcache.runtime.loading.template_bounds import (
    ITEM_WEIGHT,
    MAX_CHARS,
    OBJECT_WEIGHT,
    TemplateBoundError,
    check,
    check_grown,
    check_ints,
    check_join,
    check_percent,
    check_replace,
    counted,
    fits,
    text_size,
)

_SLOW_FILTERS = frozenset(  # Python-level work an item, a string's items its characters: a step a character
    [
        "batch",
        "dictsort",
        "groupby",
        "map",
        "max",
        "min",
        "reject",
        "rejectattr",
        "select",
        "selectattr",
        "slice",
        "sort",
        "sum",
        "unique",
        "urlize",
        "wordwrap",
    ]
)
_TEXT_FILTERS = frozenset(  # filters that write their value as text
    [
        "capitalize",
        "center",
        "e",
        "escape",
        "forceescape",
        "format",
        "indent",
        "join",
        "lower",
        "pprint",
        "replace",
        "safe",
        "string",
        "striptags",
        "title",
        "tojson",
        "trim",
        "truncate",
        "upper",
        "urlencode",
        "urlize",
        "wordcount",
        "wordwrap",
        "xmlattr",
    ]
)
_WIDTH_FILTERS = frozenset({"batch", "center", "indent", "slice", "tojson"})  # a count or width that allocates
_KEYED_FILTERS = frozenset({"dictsort", "groupby", "max", "min", "sort", "sum", "unique"})  # read every item whole


def _filter_work(name: str, value: Any) -> int:
    """The steps a filter's work on `value` costs beyond the call: Python-level work per item (sort, unique,
    groupby, select, sum) a step an item, a string's character included (`big | unique` took 14 s for 250,000
    steps); other work on a string (C speed) a step per 64 characters."""
    if isinstance(value, str):
        return len(value) if name in _SLOW_FILTERS else len(value) >> 6
    return len(value) if isinstance(value, list | tuple | dict) else 0


def _filter_checks(name: str) -> Callable[[Any, tuple[Any, ...], dict[str, Any]], None] | None:
    """What `name` checks of its value and arguments before it runs, decided once as the filter is wrapped."""
    if name in _WIDTH_FILTERS and name != "indent":  # their value is the first argument, a width or count after it
        return lambda value, args, kwargs: check_ints([*args, *kwargs.values()], f"the filter {name}")
    if name == "format":

        def format_(value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            check_percent(value, args, "the filter format's string")
            text_size((args, kwargs), "the filter format's arguments")

        return format_
    if name == "replace":

        def replace(value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if isinstance(value, str) and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
                check_replace(value, args[0], args[1])

        return replace
    if name == "join":
        return lambda value, args, kwargs: check_join(value, args[0] if args else kwargs.get("d", ""))
    if name == "indent":

        def indent(value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            check_ints([*args, *kwargs.values()], "the filter indent")
            if isinstance(value, str):
                check_grown(value, name, args[:1], {k: v for k, v in kwargs.items() if k == "width"})

        return indent
    return None


def _keyed_work(name: str, value: Any, layout: dict[str, Any], context: Any) -> int:
    """The C-speed work of a filter that reads each item whole, a step per 64 characters: max, min, sort, unique,
    groupby and dictsort lower each string they compare (`[big] * 2000 | max` lowered 20 G characters, 44 s in one
    step), sum of lists or tuples copies its total so far at each item (`[many] * 1000 | sum(start=[])`, 35 s), over
    the items or the `attribute` of them they read."""
    attribute = layout.get("attribute")
    get = make_attrgetter(context.environment, attribute) if attribute is not None else None
    items: Iterable[Any] = value
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    if name == "sum":
        start = layout.get("start", 0)
        if not isinstance(start, list | tuple):
            return 0
        total, copied = len(start), 0
        for item in items:
            part = item if get is None else get(item)
            if isinstance(part, list | tuple):
                total += len(part)
                copied += total
        if total > MAX_CHARS:
            raise TemplateBoundError(f"the filter sum would make a list of {total} items, over {MAX_CHARS}")
        return copied >> 6
    chars = 0
    for item in items:
        part = item if get is None else get(item)
        if isinstance(part, str):
            chars += len(part)
        elif isinstance(part, list | tuple):  # dictsort's pairs, a key's parts
            chars += sum(len(x) for x in part if isinstance(x, str))
    return chars >> 6


def _list_fits(budget: Any, value: Any) -> None:
    """`big | list`: a string of non-ASCII characters becomes a string object a character (1.4 GB for 16 Mi of
    them): refused before it is made, and those objects counted beside the list's pointers."""
    if isinstance(value, str) and not value.isascii():
        fits(budget, len(value) * (ITEM_WEIGHT + OBJECT_WEIGHT), "the filter list")
        budget.hold(len(value) * OBJECT_WEIGHT)


def bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` (a Jinja filter) with its work counted and its arguments and result checked. The wrapper takes the
    render's context (so it finds the budget, and Jinja never runs it while compiling) and passes `func` what
    its own mark asks for."""
    pass_arg = _PassArg.from_obj(func)  # type: ignore[arg-type]
    checks = _filter_checks(name)
    text = name in _TEXT_FILTERS
    what = f"the result of the filter {name}"
    keyed = name in _KEYED_FILTERS
    gathered = keyed or name == "join"
    signature = inspect.signature(func) if name == "tojson" or keyed else None

    @pass_context
    def run(context: Any, value: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = context.eval_ctx.budget
        if gathered and not isinstance(value, str | list | tuple | dict) and isinstance(value, Iterable):
            # each item read whole (`big_list | select | max`) or joined (`| select | join`, which made its whole
            # string before its size was checked): a generator's items gathered first, a step an item, then sized
            value = check(list(value), f"the value of the filter {name}", budget)
        if keyed and isinstance(value, list | tuple | dict) and signature is not None:
            layout = signature.bind_partial(*([None] if pass_arg else []), value, *args, **kwargs).arguments
            budget.steps -= _keyed_work(name, value, layout, context)
        budget.steps -= 1 + _filter_work(name, value)
        if budget.steps < budget.mark:
            budget.tick()
        if checks is not None:
            checks(value, args, kwargs)
        if name == "list":
            _list_fits(budget, value)
        if text and value.__class__ is not str:  # it writes its value as text (`[big] * 1000 | tojson`)
            size = text_size(value, f"the value of the filter {name}", budget)
            if signature is not None and (args or kwargs):  # tojson's indent and separators, again for each item
                layout = signature.bind_partial(*([None] if pass_arg else []), value, *args, **kwargs).arguments
                size += _json_layout(value, layout.get("indent"), layout.get("separators"), budget)
                if size > MAX_CHARS:
                    raise TemplateBoundError(f"the filter tojson would write over {MAX_CHARS} characters")
        if pass_arg is None:
            result = func(value, *args, **kwargs)
        elif pass_arg is _PassArg.context:
            result = func(context, value, *args, **kwargs)
        elif pass_arg is _PassArg.eval_context:
            result = func(context.eval_ctx, value, *args, **kwargs)
        else:
            result = func(context.environment, value, *args, **kwargs)
        if result.__class__ is types.GeneratorType:  # select, map, unique, batch...: a step an item it yields, as a
            return counted(budget, result)  # loop's (a chain of them drained by `list` ran for hours in one step)
        return check(result, what, budget)

    run.__name__ = getattr(func, "__name__", name)
    run.__doc__ = func.__doc__
    return run


def _json_layout(value: Any, indent: Any, separators: Any, budget: Any) -> int:
    """What json.dumps writes beyond its values' text: each item's separators, and with an indent a line break and
    the indent once per level (`tojson(indent=100000)` of a 1,000-item list wrote 100 M characters)."""
    item_sep, key_sep = (",", ": ") if indent is not None else (", ", ": ")
    if isinstance(separators, tuple | list) and len(separators) == 2 and all(isinstance(x, str) for x in separators):
        item_sep, key_sep = separators
    width = len(indent) if isinstance(indent, str) else max(indent, 0) if isinstance(indent, int) else 0
    line = 1 if indent is not None else 0
    extra = walked = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            extra += len(item) * (len(item_sep) + len(key_sep) + line + width * depth)
            stack += ((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            extra += len(item) * (len(item_sep) + line + width * depth)
            stack += ((v, depth + 1) for v in item)
        walked += 1
        if extra > MAX_CHARS:
            raise TemplateBoundError(f"the filter tojson would write over {MAX_CHARS} characters")
    budget.spend(walked)
    return extra


def text_test(func: Callable[..., Any]) -> Callable[..., Any]:
    """A test that writes its value as text (`lower`, `upper`: `str(value).islower()`), its size checked first."""

    @pass_context
    def run(context: Any, value: Any, /, *args: Any) -> Any:
        text_size(value, "the value of a test", context.eval_ctx.budget)
        return func(value, *args)

    return run


@pass_context
def lipsum(context: Any, n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    """Jinja's `lipsum` global, its paragraphs' words (up to `n` * `max`, each a step of Python work) charged as
    steps before it runs: `lipsum(100000)` held the thread 22 s in one call."""
    check_ints([n, min, max], "lipsum")
    budget = context.eval_ctx.budget
    budget.spend(1 + _is_count(n) * _is_count(max))
    return check(generate_lorem_ipsum(n, html, min, max), "the result of lipsum", budget)


def _is_count(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 1
