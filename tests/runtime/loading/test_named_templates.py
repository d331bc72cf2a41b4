"""Models with two chat templates ("default", which renders no tools, and "tool_use", which lists them and asks
for `<tool_call>` tags): a chat without tools renders with the default, one with tools with tool_use, as
transformers' apply_chat_template picks them. Each prompt's ids equal the template rendered directly with Jinja
the way transformers does (a sandbox, trim_blocks and lstrip_blocks) and encoded by tokenizer.json, and, where
transformers is installed, its apply_chat_template's ids for the same files. The templates come from
tokenizer_config.json's list, from chat_template.jinja and additional_chat_templates/, and from a GGUF file's
tokenizer.chat_template.tool_use (written by the `gguf` package's writer). The engine's and the server's tool
format is the tool_use template's. Bad lists and unknown names are errors naming the file."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as Backend

from radixcache.runtime.loading.chat_template import ChatTemplateError
from radixcache.runtime.loading.tokenizer import Tokenizer
from radixcache.runtime.tools import template_features, tool_template_features

LOOP = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DEFAULT = LOOP
TOOL_USE = (
    "<|im_start|>system\nYou may call:\n{% for t in tools %}- {{ t.function.name }}: {{ t.function.description }}\n"
    "{% endfor %}Answer calls as <tool_call>{...}</tool_call><|im_end|>\n" + LOOP
)
TEMPLATES = [{"name": "default", "template": DEFAULT}, {"name": "tool_use", "template": TOOL_USE}]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    },
    {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {"type": "object"}}},
]


def reference_text(template: str, tools: list[dict[str, Any]] | None) -> str:
    """The template rendered as transformers renders it (its environment's options, tools=None when none)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=MESSAGES, tools=tools, add_generation_prompt=True)


def reference_ids(directory: Path, template: str, tools: list[dict[str, Any]] | None) -> list[int]:
    backend = Backend.from_file(str(directory / "tokenizer.json"))
    return backend.encode(reference_text(template, tools), add_special_tokens=False).ids


def transformers_ids(directory: Path, tools: list[dict[str, Any]] | None, **kw: Any) -> list[int] | None:
    """transformers' apply_chat_template for the same files (None where transformers is not installed)."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    tok = PreTrainedTokenizerFast.from_pretrained(str(directory))
    kw |= {"tools": tools, "add_generation_prompt": True, "tokenize": True, "return_dict": False}
    return list(tok.apply_chat_template(MESSAGES, **kw))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.cli.conftest import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("named") / "tiny")


def with_templates(tiny: Path, directory: Path, layout: str) -> Path:
    """A copy of the tiny checkpoint whose two templates are a tokenizer_config.json list ("list") or
    chat_template.jinja and additional_chat_templates/tool_use.jinja ("files", the config's single template left
    in place: the files replace it, as transformers reads them)."""
    shutil.copytree(tiny, directory)
    if layout == "list":
        config = json.loads((directory / "tokenizer_config.json").read_text())
        (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATES}))
    else:
        (directory / "chat_template.jinja").write_text(DEFAULT, encoding="utf-8")
        (directory / "additional_chat_templates").mkdir()
        (directory / "additional_chat_templates" / "tool_use.jinja").write_text(TOOL_USE, encoding="utf-8")
    return directory


@pytest.mark.parametrize("layout", ["list", "files"])
def test_a_chat_with_tools_renders_the_tool_use_template_as_transformers_does(tiny, tmp_path, layout):
    directory = with_templates(tiny, tmp_path / "m", layout)
    tok = Tokenizer.from_hf_dir(directory)
    assert tok.chat_templates == {"default": DEFAULT, "tool_use": TOOL_USE} and tok.chat_template == DEFAULT
    for tools, template in ((None, DEFAULT), (TOOLS, TOOL_USE)):
        ids = tok.encode(tok.apply_chat_template(MESSAGES, tools=tools))
        assert ids == reference_ids(directory, template, tools), tools
        expected = transformers_ids(directory, tools)
        assert expected is None or ids == expected, tools
    listed = "You may call:\n- add: Add two integers.\n- now: The time.\n"
    assert listed in tok.apply_chat_template(MESSAGES, tools=TOOLS)
    # a name picks that template, with or without tools, as transformers' chat_template=<name> does
    named = tok.encode(tok.apply_chat_template(MESSAGES, chat_template="tool_use", tools=TOOLS))
    assert named == reference_ids(directory, TOOL_USE, TOOLS)
    plain = tok.encode(tok.apply_chat_template(MESSAGES, chat_template="default"))
    assert plain == reference_ids(directory, DEFAULT, None)
    expected = transformers_ids(directory, None, chat_template="default")
    assert expected is None or plain == expected
    # what decides how calls are written and parsed is the template a chat with tools renders with
    assert template_features(tok.chat_template).format == "generic"
    assert tool_template_features(tok).format == "hermes"


def test_a_gguf_files_tool_use_template_is_used_for_tools(kit, tmp_path):
    gguf = pytest.importorskip("gguf")
    from radixcache.runtime.loading.gguf import GGUFFile

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    tokens, types, merges = kit.tiny_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATES)  # llama.cpp's converter's keys: tokenizer.chat_template(.tool_use)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with GGUFFile(path) as f:
        assert f.metadata["tokenizer.chat_template.tool_use"] == TOOL_USE
        tok = Tokenizer.from_gguf_metadata(f.metadata, "tiny", str(path))
    assert tok.apply_chat_template(MESSAGES) == reference_text(DEFAULT, None)
    assert tok.apply_chat_template(MESSAGES, tools=TOOLS) == reference_text(TOOL_USE, TOOLS)
    assert tool_template_features(tok).format == "hermes"
    with pytest.raises(ChatTemplateError, match=re.escape(f"{path}: tiny has no chat template named 'rag'")):
        tok.apply_chat_template(MESSAGES, chat_template="rag")


def test_without_a_default_a_chat_names_its_template(tiny, tmp_path):
    """transformers refuses a chat that chose none when no template is "default"; with tools, tool_use serves."""
    directory = shutil.copytree(tiny, tmp_path / "m")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATES[1:]}))
    tok = Tokenizer.from_hf_dir(directory)
    with pytest.raises(ChatTemplateError, match=r"tokenizer_config.json: .* none named 'default'") as caught:
        tok.apply_chat_template(MESSAGES)
    assert str(caught.value).startswith(str(directory / "tokenizer_config.json"))
    assert tok.apply_chat_template(MESSAGES, tools=TOOLS) == reference_text(TOOL_USE, TOOLS)
    with pytest.raises(ChatTemplateError, match=r"no chat template named 'rag' \(its templates: tool_use\)"):
        tok.apply_chat_template(MESSAGES, chat_template="rag")
    # Jinja source is a template, not a name
    assert tok.apply_chat_template(MESSAGES, chat_template=DEFAULT) == reference_text(DEFAULT, None)


@pytest.mark.parametrize(
    ("templates", "message"),
    [
        ([{"template": DEFAULT}], 'chat_template[0] must be an object with a "name" and a "template"'),
        ([TEMPLATES[0], {"name": "tool_use"}], 'chat_template[1] must be an object with a "name" and a "template"'),
        ([{"name": "default", "template": 5}], 'chat_template[0] must be an object with a "name" and a "template"'),
        (["{{ messages }}"], "chat_template[0] must be an object"),
        ([*TEMPLATES, {"name": "default", "template": LOOP}], "chat_template names 'default' twice (chat_template[2])"),
    ],
)
def test_a_bad_template_list_is_refused_naming_the_file(tiny, tmp_path, templates, message):
    """Entries without a name or a template were dropped (the default with them, leaving no template), and a name
    given twice took the last one."""
    directory = shutil.copytree(tiny, tmp_path / "m")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": templates}))
    with pytest.raises(ValueError, match=re.escape(f"{directory / 'tokenizer_config.json'}: {message}")):
        Tokenizer.from_hf_dir(directory)


def test_a_gguf_template_list_naming_a_missing_template_is_refused(kit, tmp_path):
    meta = kit.tiny_tokenizer_metadata(typed=False) | {"tokenizer.chat_templates": ["tool_use"]}
    with pytest.raises(ValueError, match=r"m.gguf: GGUF metadata tokenizer.chat_templates names 'tool_use'"):
        Tokenizer.from_gguf_metadata(meta, where="m.gguf")
    with pytest.raises(ValueError, match=r"m.gguf: GGUF metadata tokenizer.chat_template.tool_use is int, not text"):
        Tokenizer.from_gguf_metadata(meta | {"tokenizer.chat_template.tool_use": 5}, where="m.gguf")


@pytest.mark.parametrize("other", ["tokenizer.chat_template.default", "tokenizer.chat_template."])
@pytest.mark.parametrize("plain_first", [True, False])
def test_a_gguf_files_plain_template_is_the_default_whatever_comes_beside_it(kit, other, plain_first):
    """llama.cpp's default is `tokenizer.chat_template`; a `.default` (or `.`) key written after it replaced it,
    so chats rendered with another template than llama.cpp's, by the order of the file's keys."""
    plain = {"tokenizer.chat_template": "{{ 'plain' }}"}
    extra = {other: "{{ 'other' }}"}
    base = {k: v for k, v in kit.tiny_tokenizer_metadata(typed=False).items() if not k.startswith("tokenizer.chat")}
    meta = base | (plain | extra if plain_first else extra | plain)
    tok = Tokenizer.from_gguf_metadata(meta, where="m.gguf")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "plain"
