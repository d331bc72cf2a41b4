"""`GrammarSpec`: what a request constrains its output to, in a hashable canonical form.

A spec is made from an OpenAI `response_format` (`from_response_format`) or directly (`json_object`, `json_schema`,
`regex`, `ebnf`). A JSON schema is stored as canonical JSON text: object keys sorted at every level except inside
`properties`, whose order is kept because it is the order in which the fields are generated. Two schemas that differ
only in key order (other than `properties`) therefore give equal specs and one cache entry.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import KW_ONLY, InitVar, dataclass
from typing import Any, Literal

from radixcache.runtime.grammar.errors import GrammarError
from radixcache.runtime.grammar.lark_check import check_grammar
from radixcache.runtime.grammar.regex_size import check_regex_size
from radixcache.runtime.grammar.schema_check import DATA_KEYWORDS, MAX_DEPTH, SCHEMA_MAPS, check_schema

Kind = Literal["json_object", "json_schema", "regex", "ebnf"]
KINDS: tuple[str, ...] = ("json_object", "json_schema", "regex", "ebnf")


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """`source` is the canonical schema JSON (json_schema), the pattern (regex), the grammar text (ebnf, in GBNF /
    llama.cpp syntax or Lark), or "" (json_object). `strict` (json_schema only): a keyword the grammar cannot enforce
    (`uniqueItems`, `not`, `if`, `contains`, ...) is an error, and an object with `properties` but no
    `additionalProperties` admits no other keys; otherwise such keywords are ignored and extra keys are allowed.
    Keywords nobody knows are ignored either way.
    `any_whitespace`: JSON may put any whitespace between tokens (off by default: compact `, ` / `: ` separators,
    which keeps a small model from looping on newlines). `path` is where the spec came from, for error messages.
    A regex's size (regex_size.py) and an EBNF grammar (lark_check.py) are checked when the spec is made, by any
    constructor (`dataclasses.replace` too), so a user's grammar is checked where it enters, wherever it goes later
    (compiled alone, nested beside tool calls); only the runtime's own grammars skip that (`assembled`)."""

    kind: Kind
    source: str = ""
    strict: bool = True
    any_whitespace: bool = False
    path: str = "response_format"
    _: KW_ONLY
    # not a field: made by the runtime (`assembled`), its grammar skips the user-grammar checks; any other spec is
    # checked, `dataclasses.replace` of an assembled one too (it takes an InitVar's default, never its value)
    assembled_by_runtime: InitVar[bool] = False

    def __post_init__(self, assembled_by_runtime: bool) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"unknown grammar kind {self.kind!r} (one of {', '.join(KINDS)})", self.path)
        if not isinstance(self.source, str):
            raise GrammarError("must be a string", self.path)
        if assembled_by_runtime:
            if self.kind != "ebnf":
                raise ValueError("only an EBNF grammar is assembled by the runtime")
            return
        if self.kind == "regex":  # before the library expands it: `(a{1000}){1000}` took seconds (regex_size.py)
            check_regex_size(self.source, self.path)
        elif self.kind == "ebnf":  # what the library crashed on (a `%json` const, 3,000 chained rules)
            check_grammar(self.source, self.path)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def json_object(cls, *, any_whitespace: bool = False, path: str = "response_format") -> GrammarSpec:
        return cls("json_object", "", True, any_whitespace, path)

    @classmethod
    def json_schema(
        cls,
        schema: dict[str, Any] | bool | str,
        *,
        strict: bool = True,
        any_whitespace: bool = False,
        path: str = "response_format.json_schema.schema",
    ) -> GrammarSpec:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise GrammarError(f"not valid JSON ({e})", path) from None
            except RecursionError:  # json's parser recurses per level too
                raise GrammarError(f"nests more than {MAX_DEPTH} levels of objects and arrays", path) from None
        check_schema(schema, path)
        return cls("json_schema", canonical_json(schema), bool(strict), any_whitespace, path)

    @classmethod
    def regex(cls, pattern: str, *, path: str = "regex") -> GrammarSpec:
        if not isinstance(pattern, str):
            raise GrammarError("must be a string", path)
        return cls("regex", pattern, True, False, path)

    @classmethod
    def ebnf(cls, grammar: str, *, path: str = "ebnf") -> GrammarSpec:
        if not isinstance(grammar, str) or not grammar.strip():
            raise GrammarError("must be a non-empty string", path)
        return cls("ebnf", grammar, True, False, path)

    @classmethod
    def assembled(cls, grammar: str, *, path: str = "tools") -> GrammarSpec:
        """A Lark grammar the runtime built itself (the calls a tool_choice implies, "auto" beside a constraint),
        made without the user-grammar checks: its `%json` rules carry the library's options, which a user's grammar
        may not set, and each of its parts was checked where it entered (a tool's schema with its tool, a user's
        grammar when its spec was made). Not for a user's text: `dataclasses.replace` on it checks it again. Equal
        to (and keyed as) the `ebnf` spec of the same text: how a spec was made is not part of it."""
        return cls("ebnf", grammar, path=path, assembled_by_runtime=True)

    @classmethod
    def from_response_format(cls, response_format: Any, path: str = "response_format") -> GrammarSpec | None:
        """None for `{"type": "text"}` (no constraint); a spec for `json_object` and `json_schema`
        (`{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`; `strict` absent or null means false,
        as in OpenAI's API; `schema` absent means any object)."""
        if not isinstance(response_format, dict):
            raise GrammarError("must be an object", path)
        kind = response_format.get("type")
        if kind not in ("text", "json_object", "json_schema"):
            raise GrammarError(f"unknown type {kind!r} (one of text, json_object, json_schema)", f"{path}.type")
        # a key this format does not read is refused, not dropped: a `schema` beside json_object, or a misspelt
        # `schema` inside json_schema, would otherwise constrain nothing while the caller believes it does
        _only_keys(response_format, ("type", "json_schema") if kind == "json_schema" else ("type",), path)
        if kind == "text":
            return None
        if kind == "json_object":
            return cls.json_object(path=path)
        body = response_format.get("json_schema")
        if not isinstance(body, dict):
            raise GrammarError("must be an object with a `schema`", f"{path}.json_schema")
        _only_keys(body, ("name", "description", "schema", "strict"), f"{path}.json_schema")
        strict = body.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise GrammarError("must be a boolean", f"{path}.json_schema.strict")
        schema = body.get("schema", {"type": "object"})
        return cls.json_schema(schema, strict=bool(strict), path=f"{path}.json_schema.schema")

    # ------------------------------------------------------------------ identity

    @property
    def key(self) -> str:
        """The canonical hash the compiled-grammar cache is keyed by (the `path` is not part of it)."""
        text = json.dumps([self.kind, self.source, self.strict, self.any_whitespace])
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def schema(self) -> Any:
        """The JSON schema (json_schema specs only)."""
        return json.loads(self.source)


def _only_keys(value: dict[str, Any], known: tuple[str, ...], path: str) -> None:
    """GrammarError naming the first key of `value` not in `known`."""
    unknown = next((k for k in value if k not in known), None)
    if unknown is not None:
        raise GrammarError(f"unknown field {unknown!r} (this object takes {', '.join(known)})", f"{path}.{unknown}")


def canonical_json(value: Any) -> str:
    """Compact JSON with object keys sorted at every level, except the keys of a `properties` object: a schema's
    `properties` keyword, known by its place (a def, a pattern or a data value called "properties" is not one)."""
    return json.dumps(_canonical(value), separators=(",", ":"), ensure_ascii=False)


def _canonical(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_canonical(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k in sorted(schema):
        v = schema[k]
        if k in SCHEMA_MAPS and isinstance(v, dict):  # names to schemas: in order for `properties` only
            out[k] = {name: _canonical(v[name]) for name in (v if k == "properties" else sorted(v))}
        elif k in DATA_KEYWORDS:
            out[k] = _sorted(v)
        else:
            out[k] = _canonical(v)
    return out


def _sorted(value: Any) -> Any:
    """A data value (an `enum`'s, a `const`) with its object keys sorted at every level."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value
