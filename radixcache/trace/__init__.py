"""Traces: readers, writers and generators of request streams. Never imports the simulator.

- Readers and writers: token traces (JSONL, msgpack: `token_trace`), Mooncake hash-block traces (`mooncake`), text
  traces (ShareGPT, conversations, OpenAI: `text`), format detection (`formats`); `read_trace(path)` detects the
  format (or takes `format=`) and returns the records; every reader raises `TraceError` naming file:line and the
  field on bad input (`errors`, `fields`, `jsonl`, `typed_lines`).
- `records`: `TokenRequest`, the token-level request record. `synthetic`: seeded generators (chat, agents, RAG,
  few-shot). `workload`: a trace as page-level requests in arrival order (`Workload`, `load_workload`), the form
  the simulator and the statistics read. `stats`: reuse statistics of a trace.
- `replay_output`: reading back what `radixcache replay --json` wrote (a run's log, not a trace to replay).
"""

from __future__ import annotations

from radixcache.trace.errors import TraceError
from radixcache.trace.formats import (
    CONVERSATIONS,
    FORMAT_KINDS,
    FORMATS,
    MOONCAKE,
    OPENAI,
    SHAREGPT,
    TOKEN_JSONL,
    TOKEN_MSGPACK,
    Trace,
    detect_format,
    iter_trace,
    read_trace,
)
from radixcache.trace.mooncake import DEFAULT_BLOCK_SIZE, HashRequest, iter_mooncake, write_mooncake
from radixcache.trace.text import (
    Conversation,
    Turn,
    iter_conversations,
    iter_openai,
    iter_sharegpt,
    write_conversations,
)
from radixcache.trace.token_trace import (
    iter_token_jsonl,
    iter_token_msgpack,
    request_from_dict,
    request_to_dict,
    write_token_jsonl,
    write_token_msgpack,
)

__all__ = [
    "CONVERSATIONS",
    "DEFAULT_BLOCK_SIZE",
    "FORMATS",
    "FORMAT_KINDS",
    "MOONCAKE",
    "OPENAI",
    "SHAREGPT",
    "TOKEN_JSONL",
    "TOKEN_MSGPACK",
    "Conversation",
    "HashRequest",
    "Trace",
    "TraceError",
    "Turn",
    "detect_format",
    "iter_conversations",
    "iter_mooncake",
    "iter_openai",
    "iter_sharegpt",
    "iter_token_jsonl",
    "iter_token_msgpack",
    "iter_trace",
    "read_trace",
    "request_from_dict",
    "request_to_dict",
    "write_conversations",
    "write_mooncake",
    "write_token_jsonl",
    "write_token_msgpack",
]
