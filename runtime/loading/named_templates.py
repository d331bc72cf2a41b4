"""A model's named chat templates, and which one a chat renders with (transformers' `get_chat_template` rule).

Models may ship more than one template, typically "default" and "tool_use" (Hermes 2 Pro, Command-R):
- Hugging Face: tokenizer_config.json's `chat_template` as a list of {"name": ..., "template": ...}; or, as
  transformers 4.43+ saves them, chat_template.jinja (the default) and additional_chat_templates/<name>.jinja,
  which, when either is present, replace the config's templates whole (as transformers reads them);
- GGUF: `tokenizer.chat_template` (the default) beside `tokenizer.chat_template.<name>` (llama.cpp's converter
  lists the names in `tokenizer.chat_templates` too).

`pick_template`: a chosen name picks that template; else a chat with tools renders with "tool_use" where there is
one; else with "default". A chosen template given as Jinja source (not a name) is used as it is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from radixcache.runtime.loading.chat_template import ChatTemplateError

TOOL_USE = "tool_use"
DEFAULT = "default"
JINJA_FILE = "chat_template.jinja"
JINJA_DIR = "additional_chat_templates"
_NAME = re.compile(r"[\w.-]+")  # a template name; Jinja source has braces


def pick_template(
    templates: Mapping[str, str], chosen: str | None, tools: bool, where: str, model: str = "the model"
) -> str | None:
    """The source a chat renders with: `chosen` (a name of `templates`, else Jinja source), else "tool_use" when
    `tools` are given and there is one, else "default" (None when the model has no template at all: rendering says
    so). ChatTemplateError naming `where` (the file) for a chosen name the model does not have, or when there are
    templates but none is "default" and none was chosen."""
    names = ", ".join(sorted(templates)) or "none"
    if chosen is not None:
        if chosen in templates:
            return templates[chosen]
        if _NAME.fullmatch(chosen):
            raise ChatTemplateError(f"{where}: {model} has no chat template named {chosen!r} (its templates: {names})")
        return chosen
    if tools and TOOL_USE in templates:
        return templates[TOOL_USE]
    if DEFAULT in templates or not templates:
        return templates.get(DEFAULT)
    raise ChatTemplateError(
        f"{where}: {model} has chat templates {names} but none named 'default'; pass chat_template=<name>"
    )


def hf_chat_templates(directory: str, tok_config: dict[str, Any]) -> tuple[dict[str, str], str]:
    """(name -> source, the file they came from) of a Hugging Face directory: chat_template.jinja and
    additional_chat_templates/*.jinja when there are any, else tokenizer_config.json's `chat_template` (text, or a
    list of {name, template}). ValueError naming the file for a template that is not text, an entry without a name
    or a template, a name given twice."""
    default = os.path.join(directory, JINJA_FILE)
    files = {DEFAULT: default} if os.path.isfile(default) else {}
    extra = os.path.join(directory, JINJA_DIR)
    if os.path.isdir(extra):
        for entry in sorted(os.listdir(extra)):
            if entry.endswith(".jinja") and os.path.isfile(os.path.join(extra, entry)):
                files[entry.removesuffix(".jinja")] = os.path.join(extra, entry)
    if files:
        where = files.get(DEFAULT, extra)
        return {name: _read_text(path) for name, path in files.items()}, where
    where = os.path.join(directory, "tokenizer_config.json")
    template = tok_config.get("chat_template")
    if template is None:
        return {}, where
    if isinstance(template, str):
        return {DEFAULT: template}, where
    if not isinstance(template, list):  # else found only when a chat request renders it
        raise ValueError(f"{where}: chat_template is {type(template).__name__}, not text")
    templates: dict[str, str] = {}
    for i, entry in enumerate(template):
        name = entry.get("name") if isinstance(entry, dict) else None
        source = entry.get("template") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or not isinstance(source, str):
            raise ValueError(
                f'{where}: chat_template[{i}] must be an object with a "name" and a "template" (both text), '
                f"got {entry!r:.80}"
            )
        if name in templates:
            raise ValueError(f"{where}: chat_template names {name!r} twice (chat_template[{i}])")
        templates[name] = source
    return templates, where


def gguf_chat_templates(meta: Mapping[str, Any], where: str) -> dict[str, str]:
    """name -> source of a GGUF file's metadata: `tokenizer.chat_template` as "default" (over a `.default` key beside
    it), `tokenizer.chat_template.<name>` by name. ValueError naming `where` and the key for a template that is not
    text, or a name listed in `tokenizer.chat_templates` without its template."""
    prefix = "tokenizer.chat_template"
    templates: dict[str, str] = {}
    for key, value in meta.items():
        if key == prefix or key.startswith(prefix + "."):
            if not isinstance(value, str):
                raise ValueError(f"{where}: GGUF metadata {key} is {type(value).__name__}, not text")
            name = key.removeprefix(prefix).removeprefix(".") or DEFAULT
            if key == prefix or name not in templates:  # the plain key is the default, as llama.cpp reads it, in
                templates[name] = value  # whatever order a `.default` beside it comes
    listed = meta.get("tokenizer.chat_templates", ())
    if isinstance(listed, str) or not isinstance(listed, (list, tuple)):
        raise ValueError(f"{where}: GGUF metadata tokenizer.chat_templates is {type(listed).__name__}, not a list")
    for name in listed:
        if not isinstance(name, str) or name not in templates:
            raise ValueError(f"{where}: GGUF metadata tokenizer.chat_templates names {name!r}, which has no {prefix}.*")
    return templates


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        try:
            return f.read()
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e})") from None
