"""`GrammarCompiler`: a spec in, a validated grammar out, cached by the caller's cache namespace and the spec's
canonical hash.

Compiling means translating the spec to the library's grammar (JSON schema, regex, or GBNF/Lark) and validating it
against the vocabulary; the library builds its parser tables lazily while masks are computed. Every library error
becomes a `GrammarError` naming the spec's path. The cache is a bounded LRU, safe to share between threads. A
compiled grammar is reused within its namespace only: shared, a tenant's request for a schema another tenant had just
used skipped the compile, and its time to first token told that the other had used that schema (the timing side
channel the KV cache's namespaces close). The bound is shared fairly by tenants (runtime/tools/fair_lru.py: a
namespace's tenant, else the namespace): past it the tenant holding the most loses its least recently used grammar,
so a tenant sending a stream of new schemas (under new salts or not) evicts its own, never those of a tenant holding
no more than its share (whose recompiles it could otherwise time).
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import Hashable
from dataclasses import dataclass, field

import llguidance
import numpy as np

from radixcache.runtime.grammar.errors import GrammarError
from radixcache.runtime.grammar.json_patterns import quote_safe_patterns
from radixcache.runtime.grammar.lark_check import looks_like_lark, quote_safe_lark
from radixcache.runtime.grammar.locate import locate
from radixcache.runtime.grammar.schema_check import DATA_KEYWORDS, SCHEMA_MAPS, find_key
from radixcache.runtime.grammar.schema_refs import ref_path, resolve_ref
from radixcache.runtime.grammar.spec import GrammarSpec
from radixcache.runtime.grammar.vocab import GrammarVocab
from radixcache.runtime.tools.fair_lru import FairLRU, fair_scope

JSON_OBJECT_SCHEMA = {"type": "object"}
# the paths of specs whose schema the runtime built (the calls a tool_choice requires): a path inside it names no
# field of the request, so a refusal keeps the spec's path (with the deepest cause's message)
GENERATED = ("tools",)
_UNKNOWN_FORMAT = "Unknown format"
_ONE_OF = "oneOf constraints are not supported"  # members it cannot prove exclusive (strict mode)
_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \["([^"]+)"')


class _Start:
    """A grammar's matcher at its start, never advanced: each request's matcher is a copy of it. Building a matcher
    costs about what the compile does (~17 ms for the calls of 20 tools), so a request whose grammar came from the
    cache paid it again; a copy takes ~0.03 ms. Copies may be taken from several threads at once: one at a time."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher
        self.lock = threading.Lock()


@dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """A validated grammar for one vocabulary; `GrammarState`s are made from it (`new_matcher`)."""

    spec: GrammarSpec
    grammar: str
    vocab: GrammarVocab
    start: _Start | None = field(default=None, repr=False)  # None: each matcher is built from `grammar`

    def new_matcher(self) -> llguidance.LLMatcher:
        """A matcher at the grammar's start, for one request."""
        if self.start is None:
            return build_matcher(self.grammar, self.vocab, self.spec.path)
        with self.start.lock:
            return self.start.matcher.deep_copy()


def build_matcher(grammar: str, vocab: GrammarVocab, path: str) -> llguidance.LLMatcher:
    try:
        return llguidance.LLMatcher(vocab.lib, grammar, log_level=0)
    except ValueError as e:
        raise GrammarError(str(e).strip(), path) from None


def first_mask(matcher: llguidance.LLMatcher, spec: GrammarSpec, stop_ids: tuple[int, ...]) -> None:
    """Compute the start matcher's first mask once, at compile time: a grammar that admits no text (`{"$ref": "#"}`,
    a `$ref` cycle, a regex nothing matches) or whose lexer is past its limits (a regex's size is bounded before:
    regex_size.py) fails there, a GrammarError before its request is queued; it failed at the request's first decode
    step, after its prefill, on the engine's loop, which also paid the first mask's lazy table building. Then a copy
    takes a few tokens (`first_tokens`)."""
    mask = matcher.compute_bitmask()
    if (failure := matcher_error(matcher, spec.kind)) is not None:
        raise GrammarError(failure, spec.path)
    first_tokens(matcher, mask, spec, stop_ids)


PROBE_TOKENS = 4  # the tokens the compile takes on a copy of the start matcher (`first_tokens`)


def first_tokens(
    matcher: llguidance.LLMatcher, mask: bytes, spec: GrammarSpec, stop_ids: tuple[int, ...], steps: int = PROBE_TOKENS
) -> None:
    """On a copy of `matcher`, take up to `steps` tokens, each the lowest `mask` allows but a stop token, computing
    the next mask after each: repetitions that split one text many ways (`("a"~2..4){200}`, `("a"+){1000}`,
    `("a" "a"?){3000}`), under every size bound, and a schema requiring a property whose schema requires it again
    compiled, then failed every request at its first token, after its prefill, on the engine's loop (the parser's
    50,000 items spent walking the forced text); behind a prefix (`("x" | "y") ("a"+){1000}`), at the token after
    it. A failure on this path is a GrammarError, and the grammar is never cached. One path, deterministic (the same
    grammar is refused at every compile), and short: 4 tokens took 0.3-0.6 ms on SmolLM2's vocabulary, where 8 took
    up to 11 ms (a schema's bounded string, each of its positions a new lexer state whose first mask walks the whole
    vocabulary). A grammar that gives up past it (a longer prefix, another path) fails its request there, a
    GrammarError in the same words (`matcher_error`)."""
    probe = None
    for step in range(steps):
        bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8), bitorder="little")
        bits[[t for t in stop_ids if t < len(bits)]] = 0
        token = int(bits.argmax())
        if not bits[token]:
            return
        probe = probe if probe is not None else matcher.deep_copy()
        probe.consume_token(token)
        if not probe.is_error():
            mask = probe.compute_bitmask()
        if (failure := matcher_error(probe, spec.kind)) is not None:
            where = f"its {_ORDINALS[step]} token" if step < len(_ORDINALS) else f"its token {step + 1}"
            if failure.startswith(_GIVES_UP):
                raise GrammarError(f"{_GIVES_UP} on {where}{failure[len(_GIVES_UP) :]}", spec.path)
            raise GrammarError(f"the grammar fails at {where}: {failure}", spec.path)
        if probe.is_stopped():
            return


_ORDINALS = ("first", "second", "third", "fourth")
_ITEM_LIMIT = "Too many items"  # llguidance's parser past its items for one token (50,000)
_ROW_LIMIT = "Current row has"  # llguidance's parser past its items in one row (2,000): ~4 per optional property
_GIVES_UP = "the grammar's parser gives up"


def matcher_error(matcher: llguidance.LLMatcher, kind: str) -> str | None:
    """A matcher's failure in words, or None while it has none: llguidance's first line, without the dump of its
    parser state and grammar that follows it; its "NoExtensionBias" (no token can extend the output: a regex such as
    `[^\\x00-\\U0010FFFF]` that no text matches) said in full, and a schema past its parser's row limit (too many
    optional properties at one point, refused once the output enters them) in a schema's terms, not its advice to
    make a grammar left-recursive, and its parser past its items for one token (ambiguous repetitions, a schema
    requiring itself) with the likely cause, at compile (`first_tokens`) and mid-output alike."""
    if not matcher.is_error():
        return None
    message = (matcher.get_error() or "").split("\n<state>")[0].strip() or "the grammar matcher failed"
    if message == "NoExtensionBias":
        return "no text the model can write satisfies the grammar (no token may extend the output)"
    if _ITEM_LIMIT in message:  # its advice (left recursion) is for another failure
        cause = (
            "such as a required property whose schema requires it again: no finite value satisfies it"
            if kind == "json_schema"
            else 'ambiguous repetitions such as ("a"+){1000} or ("a"~2..4){200}: make each repetition\'s items '
            'unambiguous, or count fewer; or a rule that forces itself without end, such as start: "a" start'
        )
        return f"{_GIVES_UP}: {message.split('; try')[0]} while following the text it forces ({cause})"
    if _ROW_LIMIT in message and kind == "json_schema":  # its advice is for grammar writers
        return (
            "the schema offers more optional properties at one point than the grammar can follow (about 500 in "
            "one object, fewer beside additionalProperties or the members of an anyOf): mark some required, or "
            "split the object"
        )
    return message


class GrammarCompiler:
    """Compiles `GrammarSpec`s for one vocabulary, keeping at most `max_entries` compiled grammars of at most
    `max_chars` characters of grammar in all (all namespaces together, shared fairly by their tenants: past a bound
    the tenant holding the most loses its least recently used). Each keeps its start matcher, about 40-80 bytes per
    character of its grammar (SmolLM2: 0.3 MB for the calls of 20 tools, 7,136 characters), so `max_chars` bounds
    the memory too. A grammar of more than `max_chars // 8` characters is compiled for each request, never kept."""

    def __init__(self, vocab: GrammarVocab, max_entries: int = 256, max_chars: int = 2**21) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.vocab = vocab
        self.max_entries = max_entries
        self.max_chars = max_chars
        # scope: the namespace's tenant; key: (the namespace, spec.key); weight: the grammar's length
        self._cache: FairLRU[tuple[Hashable, str], CompiledGrammar] = FairLRU(max_entries, max_chars)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def compile(self, spec: GrammarSpec, namespace: Hashable = None) -> CompiledGrammar:
        """The compiled grammar of `spec`, from the cache when an equal spec was compiled before in `namespace` (the
        request's cache namespace: another namespace's compile is never reused)."""
        scope, key = fair_scope(namespace), (namespace, spec.key)
        with self._lock:
            hit = self._cache.get(scope, key)
            if hit is not None:
                self.hits += 1
                # the key leaves out `path`: this caller's errors name its own field, not the first compiler's
                return hit if hit.spec.path == spec.path else dataclasses.replace(hit, spec=spec)
        grammar = _translate_and_validate(spec, self.vocab)
        start = build_matcher(grammar, self.vocab, spec.path)
        first_mask(start, spec, self.vocab.stop_ids)
        compiled = CompiledGrammar(spec, grammar, self.vocab, _Start(start))
        with self._lock:
            self.misses += 1
            first = self._cache.get(scope, key)  # a concurrent compile of the same spec wins once
            # a grammar past an eighth of the characters is not kept: kept, the newest entry always stays, and
            # one request's huge schema would flush the grammars of every other namespace
            if first is None and len(grammar) <= self.max_chars // 8:
                self._cache.put(scope, key, compiled, weight=len(grammar))
            compiled = first or compiled
        return compiled

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def chars(self) -> int:
        """The characters of the grammars kept, all namespaces together (what `max_chars` bounds)."""
        return self._cache.weight


def _translate_and_validate(spec: GrammarSpec, vocab: GrammarVocab) -> str:
    try:
        grammar = _translate(spec)
    except GrammarError:
        raise
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
        elif spec.kind == "json_schema":  # the library names no path: the deepest subschema it refuses alone
            found, message = locate(schema_object(spec), path, message, lambda s: _refusal(s, spec, vocab))
            path = path if path in GENERATED else found
            if spec.strict and message.startswith(_UNKNOWN_FORMAT):  # pydantic's Path, bytes, SecretStr fields
                message += " (a format the grammar does not know; send strict: false to ignore it)"
            elif message.startswith(_ONE_OF):  # its advice names an option of the library no request can set
                message = (
                    "keyword 'oneOf' cannot be enforced where a value may match more than one of its members (send "
                    "strict: false to take it as anyOf, or make the members exclusive, e.g. by a const property)"
                )
        raise GrammarError(message, path)
    return grammar


def _refusal(schema: object, spec: GrammarSpec, vocab: GrammarVocab) -> str | None:
    """The library's message refusing `schema` under `spec`'s options; None when it takes it."""
    try:
        grammar = _translate(dataclasses.replace(spec, source=json.dumps(schema)))
    except Exception:  # the translation's own refusals name their path already: not the library's
        return None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, vocab.lib)
    return (" ".join(messages).strip() or "invalid grammar") if is_error else None


def _translate(spec: GrammarSpec) -> str:
    matcher = llguidance.LLMatcher
    if spec.kind == "regex":
        return matcher.grammar_from_regex(spec.source)
    if spec.kind == "ebnf":  # a user's grammar was checked when its spec was made (lark_check.py)
        if looks_like_lark(spec.source):  # its `%json` patterns quoted as a json_schema's (json_patterns.py)
            return llguidance.grammar_from("lark", quote_safe_lark(spec.source))
        return llguidance.grammar_from("gbnf", spec.source)
    options: dict[str, object] = {"whitespace_flexible": spec.any_whitespace}
    if not spec.any_whitespace:
        options.update(item_separator=", ", key_separator=": ")
    if spec.kind == "json_object":
        return matcher.grammar_from_json_schema(JSON_OBJECT_SCHEMA, overrides=options)
    schema = quote_safe_patterns(schema_object(spec))  # a negated class's escapes (json_patterns.py)
    if spec.strict:
        schema = closed_objects(schema)
        _refuse_repeatable_counts(schema, spec.path)
    else:
        options["lenient"] = True
    return matcher.grammar_from_json_schema(schema, defaults=options)


def schema_object(spec: GrammarSpec) -> dict[str, object]:
    """A json_schema spec's schema as the library takes it, an object: JSON Schema's `true` (any value) as `{}`, its
    `false` (no value) a GrammarError."""
    schema = spec.schema()
    if schema is False:
        raise GrammarError("the schema false admits no value", spec.path)
    return {} if schema is True else schema


def _refuse_repeatable_counts(node: object, path: str) -> None:
    """Strict mode: a `minProperties` over 1 on an object whose keys are open (`additionalProperties` not false, or
    `patternProperties`) cannot be enforced: the grammar cannot keep a key from repeating, and counts what it wrote,
    but `{"a": 1, "a": 2}` parses as one property."""
    if isinstance(node, list):
        for i, v in enumerate(node):
            _refuse_repeatable_counts(v, f"{path}[{i}]")
        return
    if not isinstance(node, dict):
        return
    open_keys = node.get("additionalProperties", True) is not False or "patternProperties" in node
    if open_keys and isinstance(node.get("minProperties"), int) and node["minProperties"] > 1:
        message = "keyword 'minProperties' cannot be enforced where keys may repeat (send strict: false to ignore it)"
        raise GrammarError(message, f"{path}.minProperties")
    for k, v in node.items():
        if k in SCHEMA_MAPS and isinstance(v, dict):
            for name, sub in v.items():
                _refuse_repeatable_counts(sub, f"{path}.{k}.{name}")
        elif k not in DATA_KEYWORDS:
            _refuse_repeatable_counts(v, f"{path}.{k}")


MEMBERS = ("allOf", "anyOf", "oneOf")


def closed_objects(schema: object) -> object:
    """Strict mode: every object schema with `properties` and no `additionalProperties` admits no other key.

    Where subschemas merge into one object (an `allOf`'s members; an `anyOf`'s, `oneOf`'s or `$ref`'s beside
    `properties` of its own) each member's `additionalProperties: false` would refuse the keys the others name (JSON
    Schema's rule), leaving a required one unsatisfiable. So the merged members (and the targets of their `$ref`s)
    stay open, and the schema holding them is closed over every name they give."""
    return _Closer(schema).close(schema, (), open_=False)


class _Closer:
    def __init__(self, root: object) -> None:
        self.root = root
        self.open_targets: set[tuple[str, ...]] = set()  # JSON pointers of $ref targets that merge with a referrer
        self._find_open_targets(root)

    def close(self, node: object, at: tuple[str, ...], open_: bool) -> object:
        if isinstance(node, list):
            return [self.close(v, (*at, str(i)), open_=False) for i, v in enumerate(node)]
        if not isinstance(node, dict):
            return node
        merges = _merges(node)
        out: dict[str, object] = {}
        for k, v in node.items():
            if k in DATA_KEYWORDS:
                out[k] = v
            elif k in SCHEMA_MAPS and isinstance(v, dict):  # names to schemas (a property may be called "enum")
                out[k] = {name: self.close(s, (*at, k, name), open_=False) for name, s in v.items()}
            elif merges and k in MEMBERS and isinstance(v, list):
                out[k] = [self.close(m, (*at, k, str(i)), open_=True) for i, m in enumerate(v)]
            else:
                out[k] = self.close(v, (*at, k), open_=False)
        if open_ or at in self.open_targets or "additionalProperties" in node:
            return out
        names = self._names(node, set()) if merges else list(node.get("properties") or ())
        if "properties" in node or names:
            own = out.get("properties")
            out["properties"] = {**{n: True for n in names}, **(own if isinstance(own, dict) else {})}
            out["additionalProperties"] = False
        return out

    def _names(self, node: object, seen: set[int]) -> list[str]:
        """The property names `node` gives an object: its own, its members' and its `$ref` target's."""
        if not isinstance(node, dict) or id(node) in seen:
            return []
        seen.add(id(node))
        names = list(node.get("properties") or ()) if isinstance(node.get("properties"), dict) else []
        for key in MEMBERS:
            for member in node.get(key) if isinstance(node.get(key), list) else ():
                names += self._names(member, seen)
        if isinstance(node.get("$ref"), str):
            names += self._names(resolve_ref(self.root, node["$ref"]), seen)
        return list(dict.fromkeys(names))

    def _find_open_targets(self, node: object) -> None:
        """Every `$ref` target merged with the schema that refers to it (`_merges`), and the ones they refer to."""
        if isinstance(node, list):
            for v in node:
                self._find_open_targets(v)
            return
        if not isinstance(node, dict):
            return
        if _merges(node):
            refs = [node.get("$ref")]
            refs += [
                m.get("$ref")
                for key in MEMBERS
                if isinstance(node.get(key), list)
                for m in node[key]
                if isinstance(m, dict)
            ]
            for ref in refs:
                while isinstance(ref, str) and (target := ref_path(ref)) not in self.open_targets:
                    self.open_targets.add(target)
                    resolved = resolve_ref(self.root, ref)
                    ref = resolved.get("$ref") if isinstance(resolved, dict) else None
        for k, v in node.items():
            if k in SCHEMA_MAPS and isinstance(v, dict):
                self._find_open_targets(list(v.values()))
            elif k not in DATA_KEYWORDS:
                self._find_open_targets(v)


def _merges(node: dict[str, object]) -> bool:
    """Whether `node`'s subschemas merge into one object with it: an `allOf`, or members beside its own keys."""
    return "allOf" in node or ("properties" in node and any(k in node for k in ("anyOf", "oneOf", "$ref")))
