"""A bound on a regex's expanded size, checked before the library compiles it, naming the field that holds it.

llguidance expands counted repetitions: `(a{1000}){1000}` cost 3-4 s of a worker thread (then, on one vocabulary,
"too many expressions constructed"), a schema's `"pattern": "^a{1000000}$"` 1-2 s, for every request sending it.
`regex_size` is an upper bound on that expansion, from a scan of the pattern (not Python's `re`, whose syntax is
not the library's, Rust-like one: `\\p{L}`, `[[:alpha:]]`, `(?<name>...)`): each atom, class, escape and
`|` counts 1, a group the sum of its parts, and a repetition `{m,n}` multiplies what it repeats by `n`
(`{m}` by m, `{m,}` and `+` by m + 1 and 2: copies, then a star). Nested repetitions multiply: `(a{1000}){1000}` is
about 10**6. A regex over `MAX_REGEX_SIZE` is refused: on this 2-core machine the library compiled `a{10000}` (the
costliest shape per part: a literal repeated) in ~40 ms, `a{20000}` or 20,000 literal characters in ~85-100 ms,
`(a{100}){200}` in ~75 ms, `a{100000}` in ~0.5 s. Realistic patterns (an e-mail, a date, a UUID, `[a-z]{1,64}`)
count below 100 and `.{0,1000}` 1,000. A group whose alternatives are each one atom (`(a|b)`) counts 1, as the
class the library makes of it. Measured again (2026-12-07, SmolLM2's vocabulary, compile and first mask, a 2-core
machine under a load of ~11): literal text is what costs, `"ab" * 5000` ~50 ms as `a{10000}`, 120,000 characters
~1.15 s, so a literal past the bound stays refused; `(a|b){5000}` (15,000 counted before), `[ab]{100000}`,
`([ab]{1000}){1000}`, `(foo|bar){10000}` and `.{0,100000}` took 1-13 ms, and masks along a walk of them ~0.02-0.04
ms. The count still over-counts the last three: not refined further, as the cost of ambiguous alternations
(`(a|aa){5000}`) was not measured. A pattern the library cannot parse is counted as the scan reads it, and the
library then says what is wrong with it.
"""

from __future__ import annotations

import re

from radixcache.runtime.grammar.errors import GrammarError

MAX_REGEX_SIZE = 10_000  # `a{10000}`: ~30-50 ms of compile here; ten times that, ten times the time
_COUNTED = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}")


def check_regex_size(pattern: str, path: str, limit: int = MAX_REGEX_SIZE) -> None:
    """GrammarError at `path` when `pattern` expands to more than `limit` parts (`regex_size`)."""
    size = regex_size(pattern, limit)
    if size > limit:
        raise GrammarError(
            f"the regex expands to more than {limit:,} parts once its counted repetitions are multiplied out "
            f"(nested ones multiply); a larger one takes the grammar library seconds to build",
            path,
        )


def regex_size(pattern: str, limit: int = MAX_REGEX_SIZE, sets: bool = True) -> int:
    """An upper bound on the parts `pattern` expands to; any value over `limit` once it is known to exceed it (the
    scan stops there: a part adds at least 0 and a repetition multiplies by at least 1, so nothing later shrinks
    what was counted). `sets`: a group whose alternatives are each one atom (`(a|b)`, `(x|\\d|[yz])`) counts 1, as
    the class it matches as (`(a|b){5000}` compiled in ~1 ms, as `[ab]{5000}` does)."""
    # per open group: its closed alternatives, its current one, its last item, whether each closed alternative was
    # one atom alone, and its current one: 0 empty, 1 one atom, 2 more
    frames: list[list[int]] = [[0, 0, 0, 1, 0]]
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        top = frames[-1]
        count = 0  # a repetition's factor for the last item; else the size of the next item
        if c == "\\":
            i = _escape_end(pattern, i)
            count = -1
        elif c == "[":
            i = _class_end(pattern, i)
            count = -1
        elif c == "(":
            frames.append([0, 0, 0, 1, 0])
            if pattern.startswith("?", i + 1):  # flags or a name: `(?i)`, `(?:`, `(?P<x>`, `(?<x>`
                ends = [j for j in (pattern.find(ch, i + 2) for ch in ":>)") if j >= 0]
                if ends and pattern[min(ends)] == ")":
                    i = min(ends) - 1  # `(?i)`: the `)` closes it next
                elif ends:
                    i = min(ends)
            i += 1
            continue
        elif c == ")" and len(frames) > 1:
            alts, cur, _, single, now = frames.pop()
            top = frames[-1]
            size = 1 if sets and alts and single and now == 1 else min(alts + cur, limit + 1)
            top[4] = 1 if top[4] == 0 and size == 1 else 2
            top[1] += size
            top[2] = size
            i += 1
        elif c == "|":
            top[0], top[1], top[2] = top[0] + top[1] + 1, 0, 0
            top[3], top[4] = int(top[3] and top[4] == 1), 0
            i += 1
        elif c == "{" and (m := _COUNTED.match(pattern, i)) is not None and top[2]:
            low, has_comma, high = int(m.group(1)), m.group(2) is not None, m.group(3)
            count = int(high) if high else low + 1 if has_comma else low
            i = m.end()
        elif c in "*?":
            count = 1
            i += 1
        elif c == "+":
            count = 2
            i += 1
        else:
            count = -1
            i += 1
        if count < 0:  # an atom, a class or an escape
            top[1] += 1
            top[2] = 1
            top[4] = 1 if top[4] == 0 else 2
        elif count:  # a repetition of the last item: `count` copies of it in all
            top[4] = 2
            grown = min(top[2] * max(count, 1), limit + 1)
            top[1] += grown - top[2]
            top[2] = grown
        if top[1] + top[0] > limit:
            return limit + 1
    while len(frames) > 1:  # unclosed groups: the library refuses them, counted anyway
        alts, cur = frames.pop()[:2]
        frames[-1][1] += alts + cur
    return min(frames[0][0] + frames[0][1], limit + 1)


def _escape_end(pattern: str, i: int) -> int:
    """The index after the escape at `i`: `\\d`, `\\x41`, `\\x{1F600}`, `\\p{Greek}`, `\\u{...}`."""
    if pattern[i + 1 : i + 2] in ("x", "p", "P", "u", "U") and pattern.startswith("{", i + 2):
        close = pattern.find("}", i + 3)
        return close + 1 if close >= 0 else len(pattern)
    return min(i + 2, len(pattern))


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class opening at `i` (nested classes, `[[:alpha:]]`, escapes, and a `]` first
    in it, which is a literal)."""
    depth, j, n = 0, i, len(pattern)
    while j < n:
        c = pattern[j]
        if c == "\\":
            j = _escape_end(pattern, j)
            continue
        if c == "[":
            depth += 1
            j += 1
            j += pattern.startswith("^", j)
            j += pattern.startswith("]", j)  # `[]a]`, `[^]a]`: a literal `]`
            continue
        if c == "]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return n
