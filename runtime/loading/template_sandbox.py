"""The sandbox a chat template renders in: Jinja's immutable sandbox with template_bounds.py's bounds, wired in as
the template compiles, so the checks a render runs are decided once per template, not once per step.

`bound_tree` rewrites the parsed template: each `{% for %}`'s iterable goes through `steps_of`, each chain of `+`
(`'<|im_start|>' + m.role + '\\n' + m.content`) through one `plus`, each `~` chain through `joined`, and the right
side of a comparison or `in`, or a sliced value, through `searched` (not where it is a short literal: it costs
nothing). The code generator writes these as direct calls with the render's context (`environment.plus(context,
a, b, c)`), past the sandbox's `call`: they are the sandbox's own. Other operators (`*`, `**`, `%`) go through
`call_binop`, calls through `call`, filters through their wrappers (`bounded_filter`)."""

from __future__ import annotations

import types
from collections.abc import Callable
from functools import update_wrapper
from string import Formatter
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.environment import Template
from jinja2.runtime import Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.visitor import NodeTransformer
from markupsafe import Markup

from radixcache.runtime.loading.template_bounds import (
    ITEM_WEIGHT,
    MACRO_STEPS,
    MAX_CHARS,
    MAX_DIGITS,
    OBJECT_WEIGHT,
    SMALL_INT,
    Budget,
    TemplateBoundError,
    check,
    check_digits,
    check_grown,
    check_ints,
    check_join,
    check_percent,
    check_replace,
    check_spec,
    fits,
    searched,
    shown,
    split_count,
    steps_of,
    text_size,
    work,
)
from radixcache.runtime.loading.template_concat import add_checked, chain_of, collect, concat_in, concat_text, joined
from radixcache.runtime.loading.template_filters import bounded_filter, lipsum, text_test

_BOUNDS = frozenset({"steps_of", "plus", "plus_out", "joined", "searched", "shown"})


def bound_call(name: str, args: list[nodes.Expr], lineno: int) -> nodes.Call:
    """`environment.<name>(context, *args)`, one of the sandbox's bounds (a template's source can write no
    EnvironmentAttribute: only this transform and extensions make them)."""
    return nodes.Call(nodes.EnvironmentAttribute(name), args, [], None, None).set_lineno(lineno)


def _is_bound(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Call) and isinstance(node.node, nodes.EnvironmentAttribute) and node.node.name == name


class _Generator(CodeGenerator):
    def write_commons(self) -> None:
        super().write_commons()  # `concat` joins a set block's, a macro's and a call block's text: it checks it
        self.writeline("concat = environment.concat_in(context)")

    def visit_Call(self, node: nodes.Call, frame: Frame, forward_caller: bool = False) -> None:
        if not (isinstance(node.node, nodes.EnvironmentAttribute) and node.node.name in _BOUNDS):
            return super().visit_Call(node, frame, forward_caller=forward_caller)
        name, args = node.node.name, node.args
        if name in ("plus", "plus_out"):  # a chain of its own, passed the values its literals are formatted with
            pattern, args = _chain_pattern(args)
            chain = chain_of(pattern, len(node.args) - 1, shown=name == "plus_out")
            name = f"chain{len(self.environment.chains)}"  # type: ignore[attr-defined]
            self.environment.chains.append(chain)  # type: ignore[attr-defined]
            setattr(self.environment, name, self.environment.chains[-1])  # type: ignore[attr-defined]
        self.write(f"environment.{name}(context")  # past the sandbox's call: these are its own
        for arg in args:
            self.write(", ")
            self.visit(arg, frame)
        self.write(")")
        return None


def _chain_pattern(parts: list[nodes.Expr]) -> tuple[tuple[str | None, ...], list[nodes.Expr]]:
    """A `+` chain's literal strings (adjacent ones merged: `(x + 'a') + 'b'` is `x + 'ab'` for every x that `+`
    takes) with None for each other part, and those other parts."""
    pattern: list[str | None] = []
    values: list[nodes.Expr] = []
    for part in parts:
        if isinstance(part, nodes.Const) and part.value.__class__ is str:
            if pattern and pattern[-1] is not None:
                pattern[-1] += part.value
                continue
            pattern.append(part.value)
        else:
            pattern.append(None)
            values.append(part)
    return tuple(pattern), values


def _free(node: nodes.Expr) -> bool:
    """A literal whose search or comparison is no work (template_bounds.work gives it 0 steps)."""
    return isinstance(node, nodes.Const) and work(node.value) == 0


class _Bound(NodeTransformer):
    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        self.generic_visit(node)
        for op in node.ops:  # in searches its right side; == and < of equal-length strings compare them whole
            if not _free(op.expr):
                op.expr = bound_call("searched", [op.expr], op.expr.lineno)
        return node

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Node:
        self.generic_visit(node)
        if isinstance(node.arg, nodes.Slice):  # Jinja slices in Python, past the sandbox: big[1:] copies it
            node.node = bound_call("searched", [node.node], node.lineno)
        return node

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = bound_call("steps_of", [node.iter], node.lineno)
        return node

    def visit_Add(self, node: nodes.Add) -> nodes.Node:
        self.generic_visit(node)  # a chain `a + b + c` is Add(Add(a, b), c): its left side is a plus already
        left = node.left
        parts = list(left.args) if _is_bound(left, "plus") else [left]
        return bound_call("plus", [*parts, node.right], node.lineno)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)  # each `{{ x }}` is written as text: a list's or dict's size checked first
        for i, child in enumerate(node.nodes):
            if isinstance(child, nodes.TemplateData | nodes.Const) or _is_bound(child, "joined"):
                continue
            if _is_bound(child, "plus"):
                child.node = nodes.EnvironmentAttribute("plus_out")  # type: ignore[attr-defined]
            else:
                node.nodes[i] = bound_call("shown", [child], child.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return bound_call("joined", list(node.nodes), node.lineno)


def bound_tree(tree: nodes.Template) -> nodes.Template:
    """Counts each `{% for %}`'s iterations, each `+`, each `in`'s search and each slice's copy as steps, and
    checks each `+` and `~` concatenation's size."""
    return _Bound().visit(tree)  # type: ignore[no-any-return]


class BoundedTemplate(Template):
    """A template whose every render (each `new_context`) gets a fresh Budget, on its eval context: Jinja shares
    that object with every context derived from it (blocks, `{% set %}` blocks), and `{% autoescape %}`'s save and
    revert of its attributes keep this one object."""

    def new_context(self, vars: Any = None, shared: bool = False, locals: Any = None) -> Context:
        context = super().new_context(vars, shared, locals)
        context.eval_ctx.budget = Budget()  # type: ignore[attr-defined]
        return context


def render(template: Template, variables: dict[str, Any]) -> str:
    """`template` rendered with `variables`, as `Template.render` does (an error's traceback points into the
    template), gathered by `collect`."""
    try:
        return collect(template.root_render_func(template.new_context(variables)))
    except Exception:
        template.environment.handle_exception()
        raise  # handle_exception raises (this line is for the type checker)


class _SpecBound(Formatter):
    def format_field(self, value: Any, format_spec: str) -> Any:
        check_spec(format_spec, "a str.format field")  # as it is applied: `{:>{}}`'s width taken from the arguments
        text_size(value, "a str.format field")
        return super().format_field(value, format_spec)


class _BoundedFormatter(_SpecBound, SandboxedFormatter):
    pass


class _BoundedEscapeFormatter(_SpecBound, SandboxedEscapeFormatter):
    pass


_DIGITS_IN = frozenset({"-", "/", "//", "%"})  # operators whose integer operands are bounded by MAX_DIGITS


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with the bounds of template_bounds.py."""

    intercepted_binops = frozenset({"*", "**", "+", "%", "-", "/", "//"})
    intercepted_unops = frozenset({"-", "+"})
    code_generator_class = _Generator
    template_class = BoundedTemplate

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: bounded_filter(name, f) for name, f in self.filters.items()}
        self.tests = {**self.tests, "lower": text_test(self.tests["lower"]), "upper": text_test(self.tests["upper"])}
        self.globals["lipsum"] = lipsum
        self.shown = shown
        self.steps_of = steps_of
        self.chains: list[Any] = []  # each `+` chain's call, made as the template compiles
        self.joined = joined
        self.searched = searched
        self.concat_in = concat_in
        self.concat = concat_text  # a block's text rendered by `self.name()` (its result counted by `call`)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = context.eval_ctx.budget
        budget.steps -= 1
        if budget.steps < budget.mark:
            budget.tick()
        small = left.__class__ is int and right.__class__ is int and operator != "**"
        if small and -SMALL_INT < left < SMALL_INT and -SMALL_INT < right < SMALL_INT:  # a product: 38 digits
            return self.binop_table[operator](left, right)
        if isinstance(left, int) and isinstance(right, int) and not isinstance(left, bool):
            bits = left.bit_length() * max(right, 0) if operator == "**" else left.bit_length() + right.bit_length()
            if operator in ("*", "**") and bits // 3 > MAX_DIGITS:
                raise TemplateBoundError(f"a {operator} makes a number of over {MAX_DIGITS} digits")
        if operator in _DIGITS_IN:  # `//` of 4 million bits by 2 million took 9 s in one step
            check_digits(left, f"a {operator}")
            check_digits(right, f"a {operator}")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(n, int):
                    size = len(seq) * max(n, 0)
                    if size > MAX_CHARS:
                        raise TemplateBoundError(f"a repetition makes over {MAX_CHARS} characters or items")
                    fits(budget, size if isinstance(seq, str) else size * ITEM_WEIGHT, "a repetition")
        if operator == "+":
            return add_checked(budget, left, right)
        if operator == "%" and isinstance(left, str):
            check_percent(left, right, "the % format")
            text_size(right, "the % format's arguments", budget)
        return check(self.binop_table[operator](left, right), f"the result of {operator}", budget)

    def call_unop(self, context: Any, operator: str, arg: Any) -> Any:
        budget = context.eval_ctx.budget
        budget.steps -= 1
        if budget.steps < budget.mark:
            budget.tick()
        check_digits(arg, f"a unary {operator}")
        return self.unop_table[operator](arg)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """Jinja's sandboxed `str.format` and `format_map` (as its own, which builds its formatter inside), with
        each field's spec checked as it is applied: `{{x}}` is literal text, not a field, and a width from the
        arguments (`{:>{}}`, `{0:>{1[0]}}`, `format_map`'s `{a:>{w}}`) is checked as a number."""
        if not isinstance(value, types.MethodType | types.BuiltinMethodType) or value.__name__ not in (
            "format",
            "format_map",
        ):
            return None
        f_self = value.__self__
        if not isinstance(f_self, str):
            return None
        str_type = type(f_self)
        is_map = value.__name__ == "format_map"
        formatter = (
            _BoundedEscapeFormatter(self, escape=f_self.escape)
            if isinstance(f_self, Markup)
            else _BoundedFormatter(self)
        )

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs, args = args[0], ()
            return str_type(formatter.vformat(f_self, args, kwargs))

        return update_wrapper(wrapper, value)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        budget = __context.eval_ctx.budget
        owner = getattr(__obj, "__self__", None)
        # a method's work on its object and arguments (big.count("x"), 14 ms over 16 Mi characters) counts too
        cost = (MACRO_STEPS if __obj.__class__ is Macro else 1) + work(owner)
        for a in args:
            cost += work(a)
        budget.steps -= cost
        if budget.steps < budget.mark:
            budget.tick()
        if args and __obj.__class__ is LoopContext:  # a recursive loop's `loop(children)`: its iterations count too
            args = (steps_of(__context, args[0]), *args[1:])
        name = getattr(__obj, "__name__", "a call")
        if isinstance(owner, str):  # str's methods: widths, counts, formats
            check_ints([*args, *kwargs.values()], f"str.{name}")
            if name == "replace" and len(args) >= 2:
                check_replace(owner, *args[:3])
            elif name == "join" and args:
                check_join(args[0], owner)
            elif name in ("expandtabs", "translate"):
                check_grown(owner, name, args, kwargs)
            elif name in ("split", "rsplit", "splitlines"):
                pieces = split_count(owner, name, args, kwargs)
                fits(budget, pieces * (ITEM_WEIGHT + OBJECT_WEIGHT), f"str.{name}")
                result = check(super().call(__context, __obj, *args, **kwargs), f"the result of {name}", budget)
                budget.hold(len(result) * OBJECT_WEIGHT)  # the strings it made; check counted their pointers
                return result
        return check(super().call(__context, __obj, *args, **kwargs), f"the result of {name}", budget)
