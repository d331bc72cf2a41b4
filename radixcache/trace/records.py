"""The token-level request record shared by traces, synthetic workloads, the simulator and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """One request of a token trace.

    timestamp_ms: arrival time. tokens: the prompt's token ids. output_length: tokens the request generates.
    session: the conversation it belongs to, if any. namespace: cache namespace (tenant), None for the shared
    default. output_tokens: the recorded output, if known (its length equals output_length). retain_for: the lease
    hint, seconds its pages should be kept after it ends (the expected pause before its context returns), None for
    none. source: where a trace reader read it (`file:line`, or `file: record N (byte B)` in a msgpack stream), for
    errors found later (the replay's checks); None for a request built in Python.
    """

    timestamp_ms: float
    tokens: tuple[int, ...]
    output_length: int
    session: str | None = None
    namespace: str | None = None
    output_tokens: tuple[int, ...] | None = None
    # out of repr, so a request without a hint prints as before (tests pin existing workloads by their repr)
    retain_for: float | None = field(default=None, repr=False)
    # where it was read: not part of the request (equal requests from two files compare equal)
    source: str | None = field(default=None, repr=False, compare=False)
