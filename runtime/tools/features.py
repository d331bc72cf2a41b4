"""What a chat template knows about tools, read from its Jinja source (never by rendering it).

- `uses_tools`: the template reads a `tools` variable (as Hugging Face's apply_chat_template passes tools in OpenAI's
  function format), so it renders tools itself; otherwise the generic format (`render.py`) is used.
- `tool_role`: the template compares a role with "tool" or "ipython", so it has a turn for tool results.
- `hermes`: the template writes `<tool_call>` tags (Hermes / Qwen style), so calls are parsed from those tags.
- `command_r`: the template writes Cohere's calls: "command_r7b" where it writes `<|START_ACTION|>` (Command R7B),
  "command_r" where it writes `Action:` and `tool_name` (Command-R and Command-R+'s `Action: ```json [...]```` `),
  else "" (runtime/tools/parse_command_r.py).
- `ignores_calls`: the template reads `tools` but never `tool_calls` (it renders no assistant's calls itself), so it
  is given the calls as the text the model writes them in.
- `cohere_tools`: the template reads tools in Cohere's own shape (`name`, `description`, `parameter_definitions`, as
  Command-R and Command-R+'s first tool_use templates do), so each tool is given those fields beside OpenAI's.
- `call_id_length`: the template compares a call id's length with a number (Mistral's raise "Tool call IDs should be
  alphanumeric strings with length 9!" unless `tool_call.id|length` and a tool turn's `tool_call_id|length` are 9),
  so the calls it will render again need ids of that length (runtime.tools.use.CallIds).

`GenerationBlock` is transformers' `{% generation %}` tag, which this parser and the renderer
(`loading/chat_template.py`) both take.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from jinja2 import Environment, TemplateError, meta, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser

# A template's characters: real ones have some thousands, the longest tens of thousands; Jinja parses and compiles
# some 150 KB a second, so a longer one (a hostile GGUF's) is neither read here nor rendered (chat_template.py).
MAX_TEMPLATE_CHARS = 1 << 18


class GenerationBlock(Extension):
    """transformers' `{% generation %}...{% endgeneration %}`, which marks the assistant's text for training masks
    (TRL writes it into the templates of models it fine-tunes): rendered as its body, in a scope of its own, as
    transformers renders it when no mask is asked for."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


@dataclass(frozen=True)
class TemplateFeatures:
    uses_tools: bool = False
    tool_role: bool = False
    hermes: bool = False
    call_id_length: int | None = None  # the length the template demands of call ids, if it checks one
    command_r: str = ""  # "command_r" or "command_r7b": the template writes Cohere's calls
    cohere_tools: bool = False  # the template reads tools' `parameter_definitions`
    ignores_calls: bool = False  # the template reads `tools` but never `tool_calls`

    @property
    def format(self) -> str:
        """How calls are written: "hermes" (tags), "command_r" / "command_r7b" (Cohere's), "native" (the template's
        own, parsed as JSON) or "generic"."""
        if not self.uses_tools:
            return "generic"
        return "hermes" if self.hermes else self.command_r or "native"


@lru_cache(maxsize=16)
def template_features(source: str | None) -> TemplateFeatures:
    """The features of `source`; a template that does not compile has none (rendering it will say why). Reading
    its variables compiles it, which is where Jinja refuses a filter or test it does not know (`{{ x | foo }}`):
    the engine reads these features when it starts, so that must not stop it serving plain prompts."""
    if not source or len(source) > MAX_TEMPLATE_CHARS:
        return TemplateFeatures()
    try:
        tree = Environment(extensions=[loopcontrols, GenerationBlock]).parse(source)
        undeclared = meta.find_undeclared_variables(tree)
    except TemplateError:
        return TemplateFeatures()
    consts = {c.value for c in tree.find_all(nodes.Const) if isinstance(c.value, str)}
    return TemplateFeatures(
        uses_tools="tools" in undeclared,
        tool_role=bool({"tool", "ipython"} & consts),
        hermes=any("<tool_call>" in c for c in consts) or "<tool_call>" in source,
        call_id_length=_call_id_length(tree),
        command_r=_command_r(source),
        cohere_tools="parameter_definitions" in source,
        ignores_calls="tools" in undeclared and "tool_calls" not in source,
    )


def _command_r(source: str) -> str:
    """Which of Cohere's call syntaxes the template writes (see the module docstring), or ""."""
    if "<|START_ACTION|>" in source:
        return "command_r7b"
    return "command_r" if "Action:" in source and "tool_name" in source else ""


def _call_id_length(tree: nodes.Template) -> int | None:
    """N where the template compares `<x>.id|length` or `<x>.tool_call_id|length` (or `<x>["id"]|length`) with the
    number N (Mistral's `tool_call.id|length != 9`) from 1 to 64, else None."""
    for compare in tree.find_all(nodes.Compare):
        length = compare.expr
        if not (isinstance(length, nodes.Filter) and length.name == "length" and _is_call_id(length.node)):
            continue
        for operand in compare.ops:
            value = operand.expr
            if isinstance(value, nodes.Const) and type(value.value) is int and 0 < value.value <= 64:
                return int(value.value)
    return None


def _is_call_id(node: nodes.Node | None) -> bool:
    if isinstance(node, nodes.Getattr):
        return node.attr in ("id", "tool_call_id")
    return (
        isinstance(node, nodes.Getitem)
        and isinstance(node.arg, nodes.Const)
        and node.arg.value in ("id", "tool_call_id")
    )


def tool_template_features(tokenizer: Any) -> TemplateFeatures:
    """The features of the template a chat with tools renders with: the tokenizer's "tool_use" template where it has
    one (transformers' rule, loading/named_templates.py), else its own `chat_template`."""
    named = getattr(tokenizer, "chat_templates", None) or {}
    return template_features(named.get("tool_use") or getattr(tokenizer, "chat_template", None))
