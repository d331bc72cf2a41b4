"""What a quantised weight format costs in quality: perplexity on a text, and greedy answers on a fixed prompt set.

Shared by tests/runtime/engine/test_quant.py and scripts/eval_quant.py so that both check the same prompts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from radixcache.runtime.engine.engine import Engine
    from radixcache.runtime.model.llama import LlamaModel

# Short chat questions with one clear answer each: a greedy answer that changes here is a visible regression.
FIXED_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "What is 12 times 7?",
    "Name three primary colors.",
    "Translate 'good morning' into French.",
    "What is 2+2?",
    "Who wrote Romeo and Juliet?",
)


def perplexity(
    model: LlamaModel,
    token_ids: Sequence[int],
    window: int = 512,
    stride: int = 256,
    page_size: int = 16,
    chunk_size: int = 512,
) -> float:
    """exp(mean NLL) of every token of `token_ids` after the first, in sliding windows of `window` tokens.

    Windows start every `stride` tokens; each scores only the tokens that earlier windows did not, so every
    token is scored exactly once, with at least `window - stride` tokens of context once the text is longer
    than one window. Each window is prefilled from position 0 into a pool of its own (no KV is reused), in
    chunks of `chunk_size` tokens: a weight format whose kernel serves only small batches (quant="gguf", up to 4
    rows) is measured through that kernel with a chunk of 4.
    """
    ids = list(token_ids)
    if len(ids) < 2:
        raise ValueError("perplexity needs at least two tokens")
    if not 0 < stride < window:
        raise ValueError(f"need 0 < stride < window, got stride {stride}, window {window}")
    if window > model.config.max_position:
        raise ValueError(f"window {window} exceeds the model's max_position {model.config.max_position}")
    pages = -(-window // page_size)
    total, count, scored_to = 0.0, 0, 1  # tokens < scored_to are scored (token 0 has no prediction)
    begin = 0
    with torch.inference_mode():
        while scored_to < len(ids):
            end = min(begin + window, len(ids))
            pool = model.new_pool(pages, page_size)
            logits = model.prefill(ids[begin:end], 0, list(range(pages)), pool, chunk_size=chunk_size, all_logits=True)
            targets = torch.tensor(ids[scored_to:end], dtype=torch.int64)
            logp = torch.log_softmax(logits[scored_to - 1 - begin : end - 1 - begin].double(), dim=-1)
            total -= logp.gather(1, targets[:, None]).sum().item()
            count += end - scored_to
            scored_to = end
            begin += stride
    return math.exp(total / count)


def greedy_answers(engine: Engine, prompts: Sequence[str], max_new_tokens: int) -> list[Any]:
    """Greedy chat answers (GenerationResults) to single-turn `prompts`, all submitted in one batch."""
    conversations = [[{"role": "user", "content": p}] for p in prompts]
    return engine.chat(conversations, max_new_tokens, temperature=0.0)
