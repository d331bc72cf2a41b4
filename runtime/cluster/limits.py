"""What the front door checks of a request against the model before it sends it anywhere, as an Engine's request
builder does at its call (runtime.engine.request_builder): a replica's engine would refuse the same request, but in
the request's thread, after a handle came back (and, for a group, after the group's other prompts were sent)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.engine.errors import ContextLengthError


def check_model_limits(config: ModelConfig, ids: Sequence[int], sampling: Any) -> None:
    """ValueError, worded as the engine's, for a prompt that leaves no room under `max_position` (its
    ContextLengthError), a token id, a logit_bias id (sorted: the largest last) or a stop_token_ids id outside the
    vocabulary."""
    limit, vocab = config.max_position, config.vocab_size
    if len(ids) >= limit:
        raise ContextLengthError(
            f"prompt of {len(ids)} tokens leaves no room under the model's max_position {limit}", len(ids), limit
        )
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab})")
    bias = sampling.logit_bias
    if bias and bias[-1][0] >= vocab:
        raise ValueError(f"logit_bias token id {bias[-1][0]} is outside the vocabulary [0, {vocab})")
    if sampling.stop_token_ids and (top := max(sampling.stop_token_ids)) >= vocab:
        raise ValueError(f"stop_token_ids id {top} is outside the vocabulary [0, {vocab})")
