"""Checks of a user's EBNF grammar (Lark, or GBNF as llguidance converts it) that the library would crash on, run where
the grammar enters: when its `GrammarSpec` is made (`check_grammar`), so wherever the spec goes later (compiled
alone, nested beside tool calls) it was checked. The runtime's own grammars (`GrammarSpec.assembled`) are not: their
`%json` rules carry the library's options, which a user's schema may not set, and their parts were checked where
they entered.

- A `%json { ... }` schema inside a Lark grammar is compiled by the library as a `json_schema` is, but it skipped
  `schema_check`: a `const` of -2**63 + 1, which the library reads as a float at -2**63, crashed the process (a
  segfault), as would a `$ref` chain (`schema_refs`). Each one goes through `check_schema`; its error names the
  grammar's path, the schema's inner path in the message.
- The library compiles a rule by recursing into the rules it names, on the calling thread's stack: a chain of 3,000
  rules each naming the next (`a0: a1`, `a1: a2`, ... ~37 KB, under the server's bound on a grammar) crashed the
  process on this machine's 8 MiB stacks (2,000 compiled). A grammar whose rules chain more than `MAX_RULE_DEPTH`
  (256) deep is refused; a rule naming one being followed is recursion (`list: item | list "," item`), which adds no
  depth. A GBNF grammar's depth is read from its own text first (grammar.gbnf_scan): the library's conversion to
  Lark takes time growing with the square of a chain's length (3,000 rules: 3.4 s idle).
- A regex literal (`/.../`) is compiled as a `regex` spec is, and expands alike: `/(a{1000}){1000}/` took 4 s of a
  worker thread, `/a{1000000}/` 1.8 s. Each is bounded by `regex_size`, its error at the grammar's path, and so is
  each terminal (`A: ("a"{1000}){1000}` took 5 s), the terminals it names inlined.
- A rule's repetitions are expanded too: `start: "a"{1000000}` and `start: ("a"{1000}){1000}` compiled in ~40 ms,
  then failed every request at its first token ("Too many items (limit 50000; ff_tokens)": the parser walks the
  forced prefix in one step). A rule whose expansion (`_check_rule_sizes`) passes `MAX_RULE_SIZE` is refused
  naming it.

`quote_safe_lark` rewrites a grammar's `%json` schemas' patterns as a `json_schema`'s are (json_patterns.py), when it
is compiled. The scan skips string literals, regex literals and `//` comments; a definition starts a line (`name:`,
`?name:`, `NAME.2:`), and its body runs to the next definition.
"""

from __future__ import annotations

import json
import re

from llguidance.gbnf_to_lark import any_to_lark

from radixcache.runtime.grammar.errors import GrammarError
from radixcache.runtime.grammar.gbnf_scan import after_quoted, gbnf_uses
from radixcache.runtime.grammar.json_patterns import quote_safe_patterns
from radixcache.runtime.grammar.regex_size import check_regex_size, regex_size
from radixcache.runtime.grammar.schema_check import check_schema

MAX_RULE_DEPTH = 256
# a rule's items once expanded; on this machine's tiny and SmolLM2 vocabularies the first token failed from
# ("a" "b"){11000} (22,000 items), "a"{32000} and ("a"{100}){350}; ("a" "b"){10000} and "a"{30000} passed
MAX_RULE_SIZE = 10_000
_HEAD = re.compile(r"[ \t]*[?!]?([A-Za-z_]\w*)(?:\.-?\d+)?[ \t]*:(?!:)")
_NAME = re.compile(r"[A-Za-z_]\w*")
_DECODER = json.JSONDecoder()
_TILDE = re.compile(r"~\s*(\d+)(?:\s*\.\.\s*(\d+))?")
_SHAPE = frozenset("(){}|*+?,0123456789")


def check_grammar(text: str, path: str) -> None:
    """`check_lark` of a user's EBNF grammar: Lark as written, GBNF as the library converts it (one it cannot
    convert is left to the library, which says why), its chain depth checked before the conversion (whose time
    grows with the square of a chain's length: grammar.gbnf_scan)."""
    if looks_like_lark(text):
        check_lark(text, path)
        return
    _check_depth(gbnf_uses(text), path)
    check_lark(_gbnf_as_lark(text), path)


def looks_like_lark(text: str) -> bool:
    """GBNF rules are written `name ::= ...`; Lark rules `name: ...`."""
    return "::=" not in text


def _gbnf_as_lark(text: str) -> str:
    """A GBNF grammar as the library converts it to Lark; "" where it cannot (`grammar_from` then says why)."""
    try:
        return any_to_lark(text)
    except Exception:
        return ""


def check_lark(text: str, path: str, limit: int = MAX_RULE_DEPTH) -> None:
    """GrammarError (at `path`) for a `%json` schema `check_schema` refuses, or rules chaining deeper than `limit`."""
    uses: dict[str, list[str]] = {}  # each definition: the names its body mentions, in order
    shapes: dict[str, list[str]] = {}  # each definition's body as a regex `regex_size` reads (`_terminal_sizes`)
    current: list[str] | None = None
    shape: list[str] = []
    i, n, line_start = 0, len(text), True
    while i < n:
        if line_start and (head := _HEAD.match(text, i)) is not None:
            current = uses.setdefault(head.group(1), [])
            shape = shapes.setdefault(head.group(1), [])
            i, line_start = head.end(), False
            continue
        c = text[i]
        line_start = c == "\n"
        if c == "/" and text.startswith("//", i):
            i = _line_end(text, i)
        elif c in "\"'":
            end = after_quoted(text, i, c)
            shape.append(f"\1(x{{{max(end - i - 2, 1)}}})")
            i = end
        elif c == "/":
            end = after_quoted(text, i, "/")
            body = text[i + 1 : end - 1] if text[end - 1 : end] == "/" else text[i + 1 : end]
            _check_regex(body, path)
            shape.append(f"\1({body})")
            i = end
        elif text.startswith("%json", i):
            i = _check_json(text, i + len("%json"), path)
        elif (name := _NAME.match(text, i)) is not None:
            if current is not None:
                current.append(name.group())
            shape.append("\0" + name.group())
            i = name.end()
        elif (tilde := _TILDE.match(text, i)) is not None:  # Lark's `x ~ 3` and `x ~ 2..5`
            shape.append(f"{{{tilde.group(1)},{tilde.group(2)}}}" if tilde.group(2) else f"{{{tilde.group(1)}}}")
            i = tilde.end()
        else:
            shape.append({"[": "(", "]": ")?"}.get(c, c if c in _SHAPE else ""))
            i += 1
    _check_depth(uses, path, limit)
    _check_terminal_sizes(shapes, path)
    _check_rule_sizes(shapes, path)


def _check_depth(uses: dict[str, list[str]], path: str, limit: int = MAX_RULE_DEPTH) -> None:
    """GrammarError when the definitions' mentions (`uses`) chain deeper than `limit` (`_longest_chain`)."""
    depth, chain = _longest_chain(uses)
    if depth > limit:
        raise GrammarError(
            f"its rules chain {depth:,} deep ({' -> '.join(chain[:3])} -> ...); at most {limit} are compiled (a deeper "
            "grammar overflows the grammar compiler's stack)",
            path,
        )


def _check_terminal_sizes(shapes: dict[str, list[str]], path: str) -> None:
    """A terminal (an upper-case definition) is compiled into one regex, the terminals it names inlined: its
    strings, regex literals, repetitions (`{m,n}`, `~ m..n`) and those terminals' sizes multiply as a regex's do
    (`A: ("a"{1000}){1000}` took 5 s). Called once the chain depth is bounded (the sizes recurse along it)."""
    sizes: dict[str, int] = {}

    def size(name: str, following: frozenset[str]) -> int:
        if name not in sizes:
            parts = [
                (f"(x{{{size(p[1:], following | {name})}}})" if p[1:] in shapes and p[1:] not in following else "x")
                if p.startswith("\0")
                else p.lstrip("\1")
                for p in shapes[name]
            ]
            pseudo = "".join(parts)
            try:
                check_regex_size(pseudo, path)
            except GrammarError as exc:
                raise GrammarError(f"its terminal {name}: {exc.reason}", path) from None
            sizes[name] = max(regex_size(pseudo), 1)
        return sizes[name]

    for name in shapes:
        if name.isupper():
            size(name, frozenset())


def _check_rule_sizes(shapes: dict[str, list[str]], path: str, limit: int = MAX_RULE_SIZE) -> None:
    """A rule's items once its repetitions (`{m,n}`, `~ m..n`) are multiplied out, the rules it names multiplied
    in (a rule being followed, recursion, and a terminal or literal count 1: one lexeme). The library's parser
    walks a grammar's forced prefix on the first token in one step of at most 50,000 items: `start: "a"{1000000}`
    compiled, then failed every request. Called once the chain depth is bounded (the sizes recurse along it)."""
    sizes: dict[str, int] = {}

    def size(name: str, following: frozenset[str]) -> int:
        if name not in sizes:
            parts = [
                f"(x{{{size(p[1:], following | {name})}}})"
                if p.startswith("\0") and p[1:] in shapes and not p[1:].isupper() and p[1:] not in following
                else "x"
                if p.startswith(("\0", "\1"))
                else p
                for p in shapes[name]
            ]
            sizes[name] = max(regex_size("".join(parts), limit, sets=False), 1)  # each alternative: items
            if sizes[name] > limit:
                raise GrammarError(
                    f"its rule {name}: it expands to more than {limit:,} items once its repetitions ({{m,n}}, "
                    "~ m..n) and the rules it names are multiplied out; the grammar library's parser fails such a "
                    "grammar on its first token",
                    path,
                )
        return sizes[name]

    for name in shapes:
        if not name.isupper():
            size(name, frozenset())


def quote_safe_lark(text: str) -> str:
    """`text` (Lark) with the patterns of each `%json` schema made quote-safe (grammar.json_patterns), as a
    `json_schema`'s are: a user's `%json {"type": "string", "pattern": "^[^\\"]*$"}` let the model write a quote. The
    scan is `check_lark`'s; a schema that is no JSON is left for the library to refuse."""
    if "%json" not in text:
        return text
    out, start, i = [], 0, 0
    while i < len(text):
        c = text[i]
        if c == "/" and text.startswith("//", i):
            i = _line_end(text, i)
        elif c in "\"'/":
            i = after_quoted(text, i, c)
        elif text.startswith("%json", i):
            i += len("%json")
            while i < len(text) and text[i].isspace():
                i += 1
            try:
                schema, end = _DECODER.raw_decode(text, i)
            except (ValueError, RecursionError):
                continue
            out += [text[start:i], json.dumps(quote_safe_patterns(schema))]
            start = i = end
        else:
            i += 1
    return "".join([*out, text[start:]])


def _line_end(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _check_regex(body: str, path: str) -> None:
    """A regex literal's size (`regex_size`): `/(a{1000}){1000}/` took the library 4 s to compile."""
    try:
        check_regex_size(body, path)
    except GrammarError as exc:
        raise GrammarError(f"its regex /{body[:40]}{'...' if len(body) > 40 else ''}/: {exc.reason}", path) from None


def _check_json(text: str, i: int, path: str) -> int:
    """Check the `%json` schema whose text starts after `i` (whitespace first); the index past it."""
    while i < len(text) and text[i].isspace():
        i += 1
    try:
        schema, end = _DECODER.raw_decode(text, i)
    except (ValueError, RecursionError):
        return i  # not JSON: the library says what is wrong with it
    try:
        check_schema(schema, "%json")
    except GrammarError as exc:
        raise GrammarError(f"its schema at {exc.path}: {exc.reason}", path) from None
    return end


def _longest_chain(uses: dict[str, list[str]]) -> tuple[int, list[str]]:
    """The most definitions one chain of mentions passes through (a mention of one being followed ends it), and that
    chain; iterative, each definition measured once."""
    height: dict[str, tuple[int, list[str]]] = {}
    best: tuple[int, list[str]] = (0, [])
    for start in uses:
        if start in height:
            continue
        stack: list[list[object]] = [[start, 0, 1, [start]]]  # name, next mention, depth, chain
        following = {start}
        while stack:
            frame = stack[-1]
            name, k = str(frame[0]), int(frame[1])  # type: ignore[call-overload]
            mentions = uses[name]
            if k < len(mentions):
                frame[1] = k + 1
                sub = mentions[k]
                if sub in height:
                    _longer(frame, name, height[sub])
                elif sub in uses and sub not in following:
                    stack.append([sub, 0, 1, [sub]])
                    following.add(sub)
                continue
            stack.pop()
            following.discard(name)
            height[name] = (int(frame[2]), list(frame[3]))  # type: ignore[call-overload]
            if stack:
                _longer(stack[-1], str(stack[-1][0]), height[name])
        best = max(best, height[start], key=lambda h: h[0])
    return best


def _longer(frame: list[object], name: str, sub: tuple[int, list[str]]) -> None:
    if sub[0] + 1 > int(frame[2]):  # type: ignore[call-overload]
        frame[2], frame[3] = sub[0] + 1, [name, *sub[1][:2]]
