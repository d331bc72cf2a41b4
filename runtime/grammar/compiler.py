"""`GrammarCompiler`: a spec in, a validated grammar out, cached by the spec's canonical hash.

Compiling means translating the spec to the library's grammar (JSON schema, regex, or GBNF/Lark) and validating it
against the vocabulary; the library builds its parser tables lazily while masks are computed. Every library error
becomes a `GrammarError` naming the spec's path. The cache is a bounded LRU, safe to share between threads.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

import llguidance

from radixcache.runtime.grammar.errors import GrammarError
from radixcache.runtime.grammar.schema_check import SCHEMA_MAPS, find_key
from radixcache.runtime.grammar.spec import GrammarSpec
from radixcache.runtime.grammar.vocab import GrammarVocab

JSON_OBJECT_SCHEMA = {"type": "object"}
_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \["([^"]+)"')


@dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """A validated grammar for one vocabulary; `GrammarState`s are made from it."""

    spec: GrammarSpec
    grammar: str
    vocab: GrammarVocab


class GrammarCompiler:
    """Compiles `GrammarSpec`s for one vocabulary, keeping the last `max_entries` compiled grammars."""

    def __init__(self, vocab: GrammarVocab, max_entries: int = 256) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.vocab = vocab
        self.max_entries = max_entries
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """The compiled grammar of `spec`, from the cache when an equal spec was compiled before."""
        key = spec.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return hit
        compiled = CompiledGrammar(spec, _translate_and_validate(spec, self.vocab), self.vocab)
        with self._lock:
            self.misses += 1
            compiled = self._cache.setdefault(key, compiled)  # a concurrent compile of the same spec wins once
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return compiled

    def __len__(self) -> int:
        return len(self._cache)


def _translate_and_validate(spec: GrammarSpec, vocab: GrammarVocab) -> str:
    try:
        grammar = _translate(spec)
    except Exception as e:  # the converters (GBNF to Lark, JSON schema) raise assorted types for bad input
        raise GrammarError(str(e).strip() or type(e).__name__, spec.path) from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, vocab.lib)
    if is_error:
        message = " ".join(messages).strip() or "invalid grammar"
        path = spec.path
        unimplemented = _UNIMPLEMENTED.search(message)
        if unimplemented and spec.kind == "json_schema":
            found = find_key(spec.schema(), unimplemented.group(1), spec.path)
            path = found or path
            keyword = unimplemented.group(1)
            message = f"keyword {keyword!r} cannot be enforced by the grammar (send strict: false to ignore it)"
        raise GrammarError(message, path)
    return grammar


def _translate(spec: GrammarSpec) -> str:
    matcher = llguidance.LLMatcher
    if spec.kind == "regex":
        return matcher.grammar_from_regex(spec.source)
    if spec.kind == "ebnf":
        return llguidance.grammar_from("lark" if _looks_like_lark(spec.source) else "gbnf", spec.source)
    options: dict[str, object] = {"whitespace_flexible": spec.any_whitespace}
    if not spec.any_whitespace:
        options.update(item_separator=", ", key_separator=": ")
    if spec.kind == "json_object":
        return matcher.grammar_from_json_schema(JSON_OBJECT_SCHEMA, overrides=options)
    schema = spec.schema()
    if spec.strict:
        schema = closed_objects(schema)
    else:
        options["lenient"] = True
    return matcher.grammar_from_json_schema(schema, defaults=options)


def closed_objects(node: object) -> object:
    """Strict mode: every object schema with `properties` and no `additionalProperties` admits no other key."""
    if isinstance(node, list):
        return [closed_objects(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed_value(k, v) for k, v in node.items()}
    if "properties" in node and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


def _closed_value(keyword: str, value: object) -> object:
    """One keyword's value closed: data (`enum`, `const`, ...) as it is; a map of names to schemas (`properties`,
    ...) schema by schema, since its keys are names (a property may be called `default` or `properties`)."""
    if keyword in ("enum", "const", "default", "examples"):
        return value
    if keyword in SCHEMA_MAPS and isinstance(value, dict):
        return {name: closed_objects(sub) for name, sub in value.items()}
    return closed_objects(value)


def _looks_like_lark(text: str) -> bool:
    """GBNF rules are written `name ::= ...`; Lark rules `name: ...`."""
    return "::=" not in text
