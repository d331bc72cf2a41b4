"""Bounds on rendering a chat template: a model file's template (a GGUF from a hub) or `chat_template=` runs in this
sandbox, so a hostile one (`{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`,
`{{ "a" * 10**10 }}`) is refused with an error instead of holding a thread or taking many GB.

Every loop iteration and call is a step of the render's budget (`MAX_STEPS`; a macro call `MACRO_STEPS`); no
string or list it makes, and not its output, may hold more than `MAX_CHARS` characters (items), nor an integer
`MAX_DIGITS` digits:
`*`, `**`, `+`, `~`, `%`, widths and counts passed to a call or filter are checked before they allocate, every
call's and filter's result after, and all it makes together is bounded by `MAX_MADE`. Real templates take some
steps a message (about 7 for ChatML, 16 for Llama 3's) and make nothing near the size bounds."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from functools import wraps
from typing import Any

from jinja2 import nodes
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from radixcache.runtime.tools.features import MAX_TEMPLATE_CHARS

MAX_SOURCE = MAX_TEMPLATE_CHARS  # a template's characters (tools/features.py, which does not read a longer one)
MAX_STEPS = 1_000_000  # about 0.3 to 3 s, as a step's work goes
MACRO_STEPS = 32  # a macro call costs about as much time as this many loop iterations
MAX_CHARS = 1 << 24  # 16 Mi characters: far past any model's context, far below a machine's memory
MAX_MADE = 4 * MAX_CHARS  # what all its results hold together, each counted when made
ITEM_WEIGHT = 8  # a list's, tuple's or dict's item counts as this many characters: its pointer and (often) an object
MAX_DIGITS = 10_000  # an integer's: str() writes at most 4,300, and multiplying huge ones takes minutes


class TemplateBoundError(Exception):
    """A render went past a bound; chat_template.py turns it into a ChatTemplateError naming the template."""


class _Budget:
    __slots__ = ("made", "steps")

    def __init__(self) -> None:
        self.steps = MAX_STEPS
        self.made = MAX_MADE


_budget: ContextVar[_Budget | None] = ContextVar("chat_template_budget", default=None)
_NUMBER = re.compile(r"\d+")
_NESTED_FIELD = re.compile(r"\{[^{}]*\{")  # "{:>{}}": a width taken from the arguments


def _step(cost: int = 1) -> None:
    budget = _budget.get()
    if budget is None:
        return
    budget.steps -= cost
    if budget.steps < 0:
        raise TemplateBoundError(f"it ran past {MAX_STEPS} steps (loop iterations, calls, a filter's work)")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _digits(value: Any) -> int:
    """About an integer's decimal digits (a little over), 0 for anything else."""
    return value.bit_length() // 3 if _is_int(value) else 0


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict) else _digits(value)


def _check(value: Any, what: str) -> Any:
    """`value`, made by the template: no larger than MAX_CHARS, and counted against the render's MAX_MADE."""
    size = _size(value)
    if size > MAX_CHARS:
        raise TemplateBoundError(f"{what} is over {MAX_CHARS} characters or items")
    budget = _budget.get()
    if budget is not None and size:
        budget.made -= size * ITEM_WEIGHT if isinstance(value, list | tuple | dict) else size
        if budget.made < 0:
            raise TemplateBoundError(f"its results hold over {MAX_MADE} characters or items in all")
    return value


def _check_ints(args: Iterable[Any], what: str) -> None:
    for a in args:
        if _is_int(a) and abs(a) > MAX_CHARS:
            raise TemplateBoundError(f"{what} was passed {a}, over {MAX_CHARS}")


def _check_format(fmt: Any, args: Any, what: str, percent: bool) -> None:
    """A %- or {}-format string's own widths and precisions, and a width it takes from `args` (`%*d`, `{:>{}}`)."""
    if not isinstance(fmt, str):
        return
    if any(int(n) > MAX_CHARS for n in _NUMBER.findall(fmt) if len(n) >= 8):
        raise TemplateBoundError(f"{what} has a width or precision over {MAX_CHARS}")
    if ("*" in fmt) if percent else _NESTED_FIELD.search(fmt):
        _check_ints(args if isinstance(args, tuple | list) else [args], what)


def _check_replace(s: str, old: str, new: str, count: int = -1) -> None:
    n = s.count(old) if old else len(s) + 1
    if count >= 0:
        n = min(n, count)
    if len(s) + n * max(len(new) - len(old), 0) > MAX_CHARS:
        raise TemplateBoundError(f"replace would make a string over {MAX_CHARS} characters")


def _check_join(items: Any) -> None:
    if isinstance(items, list | tuple) and sum(len(x) for x in items if isinstance(x, str)) > MAX_CHARS:
        raise TemplateBoundError(f"join would make a string over {MAX_CHARS} characters")


def _counted(iterable: Any) -> Iterator[Any]:
    for item in iterable:
        _step()
        yield item


_SLOW_FILTERS = frozenset({"urlize", "wordwrap"})  # pure Python, about a step's time a character


def _work(name: str, value: Any) -> int:
    """The steps a filter's work on `value` costs beyond the call: Python-level work per item (sort, unique,
    groupby, select, sum) a step an item; C-speed string work a step per 64 characters."""
    if isinstance(value, str):
        return len(value) if name in _SLOW_FILTERS else len(value) // 64
    return len(value) if isinstance(value, list | tuple | dict) else 0


_WIDTH_FILTERS = frozenset({"batch", "center", "indent", "slice", "tojson"})  # a count or width that allocates


def bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` (a Jinja filter) with its arguments and result checked; functools.wraps keeps its pass_context mark."""

    first = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0  # after a context it is passed

    @wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        _step(1 + _work(name, args[first] if len(args) > first else None))
        plain = [a for a in args if isinstance(a, str | list | tuple)]
        if name in _WIDTH_FILTERS:  # their value is the first argument, a width or count after it
            _check_ints([*args[1:], *kwargs.values()], f"the filter {name}")
        if name == "format" and plain:
            _check_format(plain[0], args[1:], "the filter format's string", percent=True)
        if name == "replace" and len(plain) >= 3 and all(isinstance(a, str) for a in plain[:3]):
            _check_replace(*plain[:3])
        if name == "join" and plain:
            _check_join(plain[0])
        return _check(func(*args, **kwargs), f"the result of the filter {name}")

    return run


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with the bounds above; `steps_of` wraps each `{% for %}`'s iterable."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: bounded_filter(name, f) for name, f in self.filters.items()}
        self.steps_of = _counted
        self.concat = _concat
        self.searched = _searched

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _step()
        if _is_int(left) and _is_int(right):
            bits = left.bit_length() * max(right, 0) if operator == "**" else left.bit_length() + right.bit_length()
            if operator in ("*", "**") and bits // 3 > MAX_DIGITS:
                raise TemplateBoundError(f"a {operator} makes a number of over {MAX_DIGITS} digits")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_CHARS:
                    raise TemplateBoundError(f"a repetition makes over {MAX_CHARS} characters or items")
        if operator == "%" and isinstance(left, str):
            _check_format(left, right, "the % format", percent=True)
        elif operator == "+" and _size(left) + _size(right) > MAX_CHARS:
            raise TemplateBoundError(f"a concatenation makes over {MAX_CHARS} characters or items")
        return _check(super().call_binop(context, operator, left, right), f"the result of {operator}")

    def call(self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        # a method's work on its object and arguments (big.count("x"), 14 ms over 16 Mi characters) counts too
        work = _work("", getattr(__obj, "__self__", None)) + sum(_work("", a) for a in args)
        _step((MACRO_STEPS if isinstance(__obj, Macro) else 1) + work)
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's `loop(children)`: its iterations count too
            args = (_counted(args[0]), *args[1:])
        name = getattr(__obj, "__name__", "a call")
        fmt = getattr(getattr(__obj, "__wrapped__", None), "__self__", None)  # the sandbox's wrapped str.format
        if isinstance(fmt, str) and name in ("format", "format_map"):
            _check_format(fmt, [*args, *kwargs.values()], f"str.{name}'s string", percent=False)
        if isinstance(getattr(__obj, "__self__", None), str):  # str's methods: widths, counts, formats
            _check_ints([*args, *kwargs.values()], f"str.{name}")
            if name == "replace" and len(args) >= 2:
                _check_replace(__obj.__self__, *args[:3])
            elif name == "join" and args:
                _check_join(args[0])
        return _check(super().call(__context, __obj, *args, **kwargs), f"the result of {name}")


def _concat(parts: list[Any]) -> str:
    texts = [str(p) for p in parts]
    if sum(len(t) for t in texts) > MAX_CHARS:
        raise TemplateBoundError(f"a ~ concatenation makes over {MAX_CHARS} characters")
    return _check("".join(texts), "a ~ concatenation")


def _searched(container: Any) -> Any:
    """`container`, the right side of a comparison or `in` or a sliced value, its work counted."""
    _step(_work("", container))
    return container


class _Bound(NodeTransformer):
    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        self.generic_visit(node)
        for op in node.ops:  # in searches its right side; == and < of equal-length strings compare them whole
            op.expr = nodes.Call(nodes.EnvironmentAttribute("searched"), [op.expr], [], None, None)
        return node

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Node:
        self.generic_visit(node)
        if isinstance(node.arg, nodes.Slice):  # Jinja slices in Python, past the sandbox: big[1:] copies it
            node.node = nodes.Call(nodes.EnvironmentAttribute("searched"), [node.node], [], None, None)
        return node

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Call(nodes.EnvironmentAttribute("steps_of"), [node.iter], [], None, None)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        parts = nodes.List(list(node.nodes))
        return nodes.Call(nodes.EnvironmentAttribute("concat"), [parts], [], None, None).set_lineno(node.lineno)


def bound_tree(tree: nodes.Template) -> nodes.Template:
    """Counts each `{% for %}`'s iterations, each `in`'s search and each slice's copy as steps, and checks each
    `~` concatenation's size."""
    return _Bound().visit(tree)


def start_render() -> Any:
    """A fresh budget for one render in this context; pass the token to `end_render`."""
    return _budget.set(_Budget())


def end_render(token: Any) -> None:
    _budget.reset(token)


def collect(chunks: Iterable[str]) -> str:
    """The render's output, refused once over MAX_CHARS."""
    out: list[str] = []
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > MAX_CHARS:
            raise TemplateBoundError(f"its output is over {MAX_CHARS} characters")
        out.append(chunk)
    return "".join(out)
