"""The model's tokenizer: HF `tokenizers` underneath, built from tokenizer.json or from GGUF metadata.

BOS handling is explicit rather than left to tokenizer.json's post-processor, so that it is the same for both
sources: `encode` prepends BOS only when the model asks for it, and never twice (chat templates that already start
with the BOS text are common).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer as Backend

from radixcache.runtime.loading.byte_fallback import decode_split, reads_byte_fallback
from radixcache.runtime.loading.chat_template import ChatMessageError, render_chat_template
from radixcache.runtime.loading.detokenizer import REPLACEMENT, IncrementalDetokenizer
from radixcache.runtime.loading.gguf_model import gguf_adds_bos, gguf_eos_ids, gguf_token_id
from radixcache.runtime.loading.gguf_tokenizer import backend_from_gguf, shadowed_ids
from radixcache.runtime.loading.hf import check_added_token_ids, read_json_object
from radixcache.runtime.loading.named_templates import DEFAULT, gguf_chat_templates, hf_chat_templates, pick_template
from radixcache.runtime.loading.token_bytes import spelled_bytes
from radixcache.runtime.loading.weights import refuse_lfs_pointer
from radixcache.runtime.tools import (
    ToolCallMemory,
    ToolInputError,
    ToolSpec,
    normalize_messages,
    normalize_tools,
    template_features,
    template_messages,
)
from radixcache.runtime.tools.emitted_turns import EmittedTurn, place_emitted
from radixcache.runtime.tools.known_tokens import PromptText, encode_with_known, place_known
from radixcache.runtime.tools.literal_text import mark_tool_results, special_pattern, unmark
from radixcache.runtime.tools.messages import ChatMessage


class Tokenizer:
    """Text <-> token ids, EOS ids, and the model's chat templates: `chat_templates` maps a name to its source,
    `chat_template` is the one named "default" (loading/named_templates.py). `shadowed`: ids whose text another id
    holds in the backend, which they decode through (gguf_tokenizer.shadowed_ids)."""

    def __init__(
        self,
        backend: Backend,
        *,
        eos_token_ids: Sequence[int] = (),
        bos_token_id: int | None = None,
        add_bos: bool = False,
        chat_template: str | None = None,
        name: str = "model",
        chat_templates: Mapping[str, str] | None = None,
        templates_from: str | None = None,
        shadowed: Mapping[int, int] | None = None,
    ) -> None:
        self.backend = backend
        self.shadowed = dict(shadowed or {})  # an id the backend lacks -> the id of its text (a GGUF's repeats)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in eos_token_ids))
        self.bos_token_id = bos_token_id
        self.add_bos = bool(add_bos and bos_token_id is not None)
        self.chat_templates: dict[str, str] = dict(chat_templates or {})
        if chat_template is not None:
            self.chat_templates[DEFAULT] = chat_template
        self.templates_from = templates_from or "the tokenizer"  # the file they came from, for errors
        self.name = name

    @property
    def chat_template(self) -> str | None:
        """The default template (None when there is none); setting it replaces the default alone."""
        return self.chat_templates.get(DEFAULT)

    @chat_template.setter
    def chat_template(self, source: str | None) -> None:
        if source is None:
            self.chat_templates.pop(DEFAULT, None)
        else:
            self.chat_templates[DEFAULT] = source

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any], name: str = "model", where: str = "GGUF metadata") -> Tokenizer:
        """From a GGUF file's `tokenizer.ggml.*` and `tokenizer.chat_template(.<name>)` metadata; ValueError naming
        `where` (the file) and the key for metadata of the wrong type or out of range."""
        templates = gguf_chat_templates(meta, where)
        return cls(
            backend_from_gguf(meta, where),
            shadowed=shadowed_ids(meta, where),
            eos_token_ids=gguf_eos_ids(meta, where),
            bos_token_id=gguf_token_id(meta, "tokenizer.ggml.bos_token_id", where),
            add_bos=gguf_adds_bos(meta, where),
            chat_templates=templates,
            templates_from=where,
            name=name,
        )

    @classmethod
    def from_hf_dir(cls, directory: str | os.PathLike[str], name: str | None = None) -> Tokenizer:
        """From a Hugging Face model directory: tokenizer.json, plus tokenizer_config.json, chat_template.jinja,
        additional_chat_templates/, config.json and generation_config.json for BOS/EOS and the chat templates when
        present (loading/named_templates.py)."""
        directory = os.fspath(directory)
        path = os.path.join(directory, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{directory}: no tokenizer.json (only fast-tokenizer directories are supported)")
        try:
            backend = Backend.from_file(path)
        except Exception as e:  # tokenizers raises a plain Exception for any file it cannot read
            refuse_lfs_pointer(path)
            raise ValueError(f"{path}: not a tokenizer.json the tokenizers library can read ({e})") from None
        check_added_token_ids(backend, path)
        tok_config = _read_json(os.path.join(directory, "tokenizer_config.json"))

        def token_id(value: Any) -> int | None:
            text = value.get("content") if isinstance(value, dict) else value
            return backend.token_to_id(text) if isinstance(text, str) else None

        # BOS: what tokenizer.json's post-processor prepends, unless tokenizer_config.json says otherwise.
        with_special = backend.encode("a", add_special_tokens=True).ids
        plain = backend.encode("a", add_special_tokens=False).ids
        probed = with_special[0] if len(with_special) > len(plain) and with_special[:1] != plain[:1] else None
        bos = token_id(tok_config.get("bos_token")) if tok_config.get("bos_token") else probed
        add_bos = tok_config.get("add_bos_token", probed is not None)
        if add_bos is not None and not isinstance(add_bos, bool):  # "false" is true to bool(): a BOS not asked for
            where = os.path.join(directory, "tokenizer_config.json")
            raise ValueError(f"{where}: add_bos_token must be true or false, got {add_bos!r}")

        eos: list[int] = []
        n_tokens = id_limit(backend)
        for cfg_name in ("generation_config.json", "config.json"):
            json_path = os.path.join(directory, cfg_name)
            value = _read_json(json_path).get("eos_token_id")
            ids = [value] if isinstance(value, int) else value or []
            if not isinstance(ids, list) or not all(_is_token_id(i) for i in ids):
                raise ValueError(f"{json_path}: eos_token_id {value!r} is not a token id or a list of them")
            if past := [i for i in ids if i >= n_tokens]:  # never sampled; a grammar's vocabulary refuses it
                raise ValueError(
                    f"{json_path}: eos_token_id {past[0]} is past the token ids of tokenizer.json (0 to {n_tokens - 1})"
                )
            eos.extend(ids)
        if (tid := token_id(tok_config.get("eos_token"))) is not None:  # first: the template's eos_token, as in
            eos.insert(0, tid)  # transformers (generation_config's first id may be another, e.g. <|end_of_text|>)
        templates, templates_from = hf_chat_templates(directory, tok_config)

        return cls(
            backend,
            eos_token_ids=eos,
            bos_token_id=bos if bos is not None else probed,
            add_bos=bool(add_bos),
            chat_templates=templates,
            templates_from=templates_from,
            name=name or os.path.basename(os.path.normpath(directory)),
        )

    # ------------------------------------------------------------------ text <-> ids

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens and shadowed ids included."""
        return self.backend.get_vocab_size(with_added_tokens=True) + len(self.shadowed)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Special-token text (e.g. "<|im_start|>") maps to its id. BOS is prepended when
        the model asks for it and `add_special_tokens`, unless the text already starts with it. A `PromptText`
        (from `apply_chat_template`) keeps the ids the model emitted for its known spans (runtime.tools.known_tokens).
        """
        if isinstance(text, PromptText) and text.known:
            return encode_with_known(
                text,
                lambda piece, first: self.encode(piece, add_special_tokens and first),
                self._spelled,
                lambda: self._canonical(text, add_special_tokens),
            )
        try:
            ids = self.backend.encode(text, add_special_tokens=False).ids
        except TypeError:  # the backend's "TextInputSequence must be str" for a str it cannot read as UTF-8
            _check_unicode(text)
            raise
        if add_special_tokens and self.add_bos and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids

    def _canonical(self, text: PromptText, add_special_tokens: bool) -> list[int]:
        """`text` encoded anew, its literal spans (a tool result's special-token text) kept as their plain-text ids:
        a SentencePiece tokenizer reads text after a special token with a "▁" of its own, so a prompt with such a
        span never spelled its canonical encoding, and that encoding read the result's `</s>` as the control token."""
        ids: list[int] = []
        pos = 0
        for span in text.known:
            if span.literal:
                ids += self.encode(str(text[pos : span.start]), add_special_tokens and pos == 0) + list(span.token_ids)
                pos = span.end
        return ids + self.encode(str(text[pos:]), add_special_tokens and pos == 0)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True, keep: Collection[int] = ()) -> str:
        """The text of `ids`. A byte-fallback run that is not all UTF-8 keeps its complete characters, each bad
        byte one U+FFFD (loading/byte_fallback.py; the library's decoder shows the whole run as U+FFFD). `keep`:
        special tokens shown even when `skip_special_tokens` (a tool-call format's own, runtime.tools.call_tokens),
        decoded with the rest as the library decodes a text that has them."""
        ids = [self.shadowed.get(i, i) for i in ids] if self.shadowed else ids
        if skip_special_tokens and keep:  # the library skips special tokens by leaving them out: so do we
            ids = [i for i in ids if i in keep or i not in self._special_ids]
            skip_special_tokens = False
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if REPLACEMENT not in text or not self._byte_fallback:
            return text
        return decode_split(self.backend, ids, skip_special_tokens, self._special_ids)

    @functools.cached_property
    def _byte_fallback(self) -> bool:
        return reads_byte_fallback(self.backend)

    @functools.cached_property
    def _special_ids(self) -> frozenset[int]:
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    def _spelled(self, ids: Sequence[int]) -> str:
        """The text `ids` stand for where they follow other text (a known span's check): their bytes joined. A
        SentencePiece decoder drops the space of the first token of what it decodes, and a reply's text (read after
        its prompt) keeps it, so decoded alone the ids of " {" never matched their span and were encoded anew."""
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", "replace")

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(self.shadowed.get(token_id, token_id))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for, which may be part of a UTF-8 character (for logprobs and the grammar's
        vocabulary; loading/token_bytes.py)."""
        text = self.decode([token_id], skip_special_tokens=False)
        return spelled_bytes(self.id_to_token(token_id) or "", text)

    def detokenizer(self, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        """A streaming detokeniser: `add(id)` returns text deltas that never split a UTF-8 character."""
        return IncrementalDetokenizer(lambda ids: self.decode(ids, skip_special_tokens), prompt_ids)

    # ------------------------------------------------------------------ chat

    def apply_chat_template(
        self,
        messages: Sequence[Any],
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        *,
        tools: Sequence[Any] | None = None,
        tool_memory: ToolCallMemory | None = None,
        **variables: Any,
    ) -> str:
        """The prompt text for `messages`, rendered with the model's own template, picked as transformers does
        (`pick_template`): `chat_template` (a name of `chat_templates`, or Jinja source), else "tool_use" when
        `tools` is given and the model has one, else "default".

        Messages may be agent histories (radixcache.runtime.tools.messages: tool calls, tool results, `name`, the
        developer role as the system message). `tools` (OpenAI's function format, or `ToolSpec`s) are rendered by
        the template when it reads a `tools` variable, else in the generic format (radixcache.runtime.tools.render);
        `tool_memory` gives the exact text the model emitted for the calls it made, and the result is then a
        `PromptText` carrying the ids it emitted them as, where known, so `encode` gives back those very tokens. A bad
        message or tool raises `ChatMessageError` naming the field."""
        chosen = chat_template or None
        source = pick_template(self.chat_templates, chosen, tools is not None, self.templates_from, self.name)
        try:
            history = normalize_messages(messages)
            specs = tuple(tools) if tools and all(isinstance(t, ToolSpec) for t in tools) else normalize_tools(tools)
        except ToolInputError as e:
            raise ChatMessageError(e.path, e.problem) from None
        marked, marks = mark_tool_results(history, self._special_texts)  # a result's <|im_end|> stays text
        args = (source, specs, tool_memory, add_generation_prompt, variables)
        if marks is None:
            return self._placed(history, *args)
        literal = unmark(self._placed(marked, *args), marks, self._literal_ids)
        return self._placed(history, *args) if literal is None else literal

    def _placed(
        self,
        history: Sequence[ChatMessage],
        source: str,
        specs: Sequence[ToolSpec],
        memory: ToolCallMemory | None,
        add_generation_prompt: bool,
        variables: Mapping[str, Any],
    ) -> str:
        """`history` rendered by `source`, with the ids the model emitted for the replies `memory` knows."""
        rendered, extra = template_messages(history, template_features(source), tools=specs, memory=memory)
        kw = {
            "bos_token": self._token_text(self.bos_token_id),
            "eos_token": self._token_text(self.eos_token_ids[0] if self.eos_token_ids else None),
            **extra,
            **variables,
        }

        def render(chat: list[dict[str, Any]], generation_prompt: bool = add_generation_prompt) -> str:
            return render_chat_template(source, chat, add_generation_prompt=generation_prompt, model=self.name, **kw)

        if any(isinstance(m, EmittedTurn) for m in rendered):  # R7B's: the replies in place of the template's text
            ends = [self._token_text(i) for i in self.eos_token_ids]
            return place_emitted(render(rendered), rendered, render, self._spelled, ends)
        return place_known(render(rendered), rendered, render)  # the ids of the calls the memory knows

    @functools.cached_property
    def _special_texts(self) -> re.Pattern[str] | None:
        """The control tokens' texts, which a tool result may spell (runtime/tools/literal_text.py)."""
        return special_pattern(list(self._control_tokens.values()))

    @functools.cached_property
    def _control_tokens(self) -> dict[int, str]:
        """The added tokens a tool result must not spell as themselves: the special ones, and the others but runs of
        whitespace (Qwen's `<tool_call>` and `</tool_response>` are added as not special: a result holding
        `</tool_response>` closed its response as the template's own token)."""
        added = self.backend.get_added_tokens_decoder().items()
        return {i: t.content for i, t in added if t.content and (t.special or t.content.strip())}

    @functools.cached_property
    def _literal_backend(self) -> Backend:
        """A copy of the backend that reads special tokens' texts as plain text (its own object: the flag is the
        backend's, and other threads encode with the shared one)."""
        backend = Backend.from_str(self.backend.to_str())
        backend.encode_special_tokens = True
        return backend

    def _literal_ids(self, text: str) -> list[int]:
        """The ids of `text` read as plain text (a special token's text a tool result spells), following other
        text: a SentencePiece tokenizer's "▁" put before it left out (it would read as a space). Where that "▁" is
        merged into the first piece (Llama 2's "▁</" of "</s>": " </s>" is no span of "</s>", and the span left out
        was read with the rest, its `</s>` the control token), or the model's vocabulary holds the special text as a
        piece, the text is spelled a character at a time."""
        ids = self._plain_ids(text)
        if ids is not None:
            return ids
        chars = [self._plain_ids(c) or self._char_ids(c) for c in text]
        return (
            [i for c in chars for i in c]
            if all(chars)
            else self._literal_backend.encode(text, add_special_tokens=False).ids
        )

    def _plain_ids(self, text: str) -> list[int] | None:
        """`text`'s ids by the literal backend, a lone leading "▁" left out, if they spell it with no special id."""
        ids = self._literal_backend.encode(text, add_special_tokens=False).ids
        if self._spelled(ids) != text and ids and self._spelled(ids[:1]) == " ":
            ids = ids[1:]
        ok = self._spelled(ids) == text and not any(i in self._control_tokens for i in ids)
        return ids if ok else None

    def _char_ids(self, char: str) -> list[int]:
        """One character's ids from the vocabulary: the piece that is it, else its byte-fallback pieces; [] if
        neither spells it."""
        whole = self.backend.token_to_id(char)
        if whole is not None and whole not in self._control_tokens and self._spelled([whole]) == char:
            return [whole]
        pieces = [self.backend.token_to_id(f"<0x{b:02X}>") for b in char.encode()]
        ok = None not in pieces and self._spelled(pieces) == char  # type: ignore[arg-type]
        return pieces if ok else []  # type: ignore[return-value]

    def _token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else self.backend.id_to_token(token_id) or ""

    def __repr__(self) -> str:
        return (
            f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, eos={self.eos_token_ids}, add_bos={self.add_bos})"
        )


def id_limit(backend: Backend, with_added_tokens: bool = True) -> int:
    """One past the largest token id of `backend` (of its model's vocabulary alone, without `with_added_tokens`):
    its vocab size counts the ids, and a tokenizer.json whose ids have gaps has ids past that count."""
    return max(backend.get_vocab(with_added_tokens=with_added_tokens).values(), default=-1) + 1


def lone_surrogate(text: str) -> str | None:
    """The first lone surrogate of `text` (from "\\ud800" in JSON, or bytes read with surrogateescape), which no
    UTF-8 tokenizer can encode; None where there is none."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return text[e.start]
    return None


def _check_unicode(text: str) -> None:
    """A ValueError naming the first lone surrogate of `text` (`lone_surrogate`)."""
    if (bad := lone_surrogate(text)) is not None:
        raise ValueError(f"the text is not valid Unicode: it holds a lone surrogate {bad!r}")


def _read_json(path: str) -> dict[str, Any]:
    """An optional JSON object file: {} when absent, ValueError naming it when it is not a JSON object."""
    return read_json_object(path) if os.path.isfile(path) else {}


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
