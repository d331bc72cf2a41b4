"""Render a model's own Jinja chat template, the way Hugging Face `transformers` does, in a sandbox."""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols

from radixcache.runtime.loading.template_bounds import MAX_CHARS, MAX_SOURCE, TemplateBoundError, text_of
from radixcache.runtime.loading.template_filters import bounded_filter
from radixcache.runtime.loading.template_sandbox import BoundedSandbox, bound_tree, render
from radixcache.runtime.tools.errors import ToolInputError
from radixcache.runtime.tools.features import GenerationBlock


class ChatTemplateError(ValueError):
    """The model has no chat template, or its template rejected the messages."""


class ChatMessageError(ChatTemplateError, ToolInputError):
    """A message (or tool definition) the runtime cannot render; `path` names it (`messages[2].tool_call_id`)."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(text_of(message, "raise_exception's message"))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' `tojson`, its arguments in its order: `tojson(true)` is ensure_ascii, and templates pass
    `separators=(',', ':')` for compact JSON. A lone surrogate (a call's arguments `"\\ud800"`, which json.loads
    reads as one) stays the escape `\\ud800` as ensure_ascii writes it: written raw it is no Unicode text, and the
    tokenizer refuses the whole prompt; JSON text holds a surrogate only inside a string, where the escape is valid."""
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _strftime_now(fmt: str) -> str:
    if len(text_of(fmt, "strftime_now's format")) * 32 > MAX_CHARS:  # a directive writes up to ~30 characters
        raise TemplateBoundError(f"strftime_now's format of {len(fmt)} characters could write over {MAX_CHARS}")
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> Any:
    """Compile a chat template once (templates are immutable strings, so caching by source is safe), in a sandbox
    that bounds its work and sizes (template_sandbox.py, template_bounds.py)."""
    if len(source) > MAX_SOURCE:  # Jinja compiles some 150 KB a second: a hostile one of GB would never end
        raise ChatTemplateError(f"the chat template is {len(source)} characters, over the {MAX_SOURCE} it may have")
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, GenerationBlock])
    env.filters["tojson"] = bounded_filter("tojson", _tojson)  # its indent a bounded width, as the sandbox's own
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        code = env.compile(bound_tree(env.parse(source)))
        return env.template_class.from_code(env, code, env.make_globals(None))
    except Exception as e:  # a syntax error, or a literal int() refuses ({{ 111...1 }}, 5,000 digits)
        detail = str(e) if isinstance(e, TemplateError) else f"{type(e).__name__}: {e}"
        raise ChatTemplateError(f"the chat template does not compile: {detail}") from e


def render_chat_template(
    source: str | None,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    model: str = "the model",
    **variables: Any,
) -> str:
    """Render `messages` with the template `source`; `variables` (bos_token, eos_token, tools, ...) are passed in."""
    if not source:
        raise ChatTemplateError(
            f"{model} has no chat template (tokenizer.chat_template in GGUF, chat_template in tokenizer_config.json "
            "or chat_template.jinja); pass chat_template=... or encode plain text instead"
        )
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise ChatTemplateError(f"each message must be a dict with a 'role', got {m!r}")
    template = compile_template(source)
    try:  # each render has a budget of its own (template_sandbox.BoundedTemplate)
        return render(template, {**variables, "messages": messages, "add_generation_prompt": add_generation_prompt})
    except ChatTemplateError:
        raise
    except TemplateBoundError as e:
        raise ChatTemplateError(f"the chat template of {model} was stopped: {e}") from e
    except Exception as e:  # Jinja's errors, and what the template's own expressions raise (1/0, str + int, a
        # macro that recurses forever): the template rejected these messages, whichever way it failed
        detail = str(e) if isinstance(e, TemplateError) else f"{type(e).__name__}: {e}"
        raise ChatTemplateError(f"the chat template of {model} failed: {detail}") from e
