"""Arguments the synthetic generators share, checked when a generator is called: before any request is made, so a
bad one is a ValueError naming it, never a failure half-way through writing a trace (or a trace its own readers
refuse: ids past int64, infinite timestamps)."""

from __future__ import annotations

from collections.abc import Mapping

#: token ids are drawn from range(vocab) and a trace's ids must be below 2**63
MAX_VOCAB = 2**63
#: the longest lease hint (retain_for, seconds) a trace's readers take
MAX_RETAIN_FOR_S = 1e9
#: the most token ids a generator makes for one length, holds up front (its shared prompts, documents, examples)
#: or holds for one unit (a conversation's, an agent's or a batch's prompts): 2**24, past any model's context.
#: Larger ones (system_tokens=10**17) spent hours making ids before the first line was written.
MAX_TOKENS = 2**24
#: the most token ids agent_sessions holds, the whole trace (it makes every request before the first): 2 GiB of
#: references; 10**6 agents at the defaults (44 billion) ran out of memory or time before a line was written
MAX_TRACE_TOKENS = 2**28
#: the longest mean time (ms; order_noise's ranks too) a generator takes: about 31.7 years. A gap is at most ~37
#: means (expovariate of a double), so a trace's timestamps stay far below the readers' MAX_TIMESTAMP_MS, which a
#: mean of 1e308 ms passed at the second request: trace gen failed there, after making the first.
MAX_MEAN_MS = 1e12
#: the most units (conversations, agents, queries, batches) a generator makes: 2**20, about 50 GB of chat JSONL at
#: the defaults. trace gen writes as it makes them, so --count 2**63-1 wrote until the disk filled (7.9 GB in 20 min).
MAX_UNITS = 2**20


def check_ints(name: str, values: Mapping[str, object]) -> None:
    """Raise ValueError, worded `name: need ...`, unless each value is an int (not a bool) or a pair of ints (a tuple
    or list): a float count failed later as a TypeError, a string range on a comparison, and True passed as 1."""
    for key, value in values.items():
        pair = isinstance(value, (tuple, list))
        items = tuple(value) if pair else (value,)  # type: ignore[arg-type]
        if (pair and len(items) != 2) or any(isinstance(v, bool) or not isinstance(v, int) for v in items):
            raise ValueError(f"{name}: need {key} {'a pair of ints' if pair else 'an int'}, got {value!r}")


def check_units(name: str, key: str, units: int) -> None:
    """Raise ValueError, worded `name: need 0 <= key <= MAX_UNITS`, unless `units` (an int) is in [0, MAX_UNITS]."""
    if not 0 <= units <= MAX_UNITS:
        raise ValueError(f"{name}: need 0 <= {key} <= {MAX_UNITS:,} (2**20), got {units!r}")


def check_generator_args(
    name: str,
    vocab: int,
    lengths: Mapping[str, int],
    times: Mapping[str, float],
    shares: Mapping[str, float] | None = None,
) -> None:
    """Raise ValueError, worded `name: need ...`, unless 1 <= vocab <= 2**63, every length (tokens) is in
    [0, MAX_TOKENS], every time (a mean gap in ms, a spread) in [0, MAX_MEAN_MS] and every share (a probability) in
    [0, 1]; vocab and the lengths are ints."""
    check_ints(name, {"vocab": vocab, **lengths})
    if not 1 <= vocab <= MAX_VOCAB:
        raise ValueError(f"{name}: need 1 <= vocab <= 2**63, got {vocab!r}")
    for key, length in lengths.items():
        if not 0 <= length <= MAX_TOKENS:
            raise ValueError(f"{name}: need 0 <= {key} <= {MAX_TOKENS:,} (2**24) tokens, got {length!r}")
    for key, value in times.items():
        if not 0 <= value <= MAX_MEAN_MS:  # NaN fails too
            raise ValueError(f"{name}: need 0 <= {key} <= {MAX_MEAN_MS:g}, got {value!r}")
    for key, value in (shares or {}).items():
        if not 0 <= value <= 1:
            raise ValueError(f"{name}: need {key} in [0, 1], got {value!r}")


def check_held(name: str, held: Mapping[str, int], bound: int = MAX_TOKENS) -> None:
    """Raise ValueError, worded `name: ...`, when the most tokens a generator could hold for one of `held` (a label
    naming the parameters, e.g. 'system_prompts x system_tokens') passes `bound` (MAX_TOKENS). Call after
    check_generator_args: the bound of each length makes these products small enough to compute."""
    for what, tokens in held.items():
        if tokens > bound:
            raise ValueError(
                f"{name}: {what} may reach {tokens:,} tokens, at most {bound:,} (2**{bound.bit_length() - 1})"
            )


def most(length: int) -> int:
    """The longest a length drawn around `length` can be (synthetic's _around: up to 1.5x, at least 1)."""
    return max(1, length + length // 2)
