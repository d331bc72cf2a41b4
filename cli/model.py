"""`radixcache model info`: a model's architecture, parameter count and KV bytes per token."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from radixcache.cli.engine_options import load_engine_model, model_option
from radixcache.cli.errors import FriendlyCommand, FriendlyGroup, debug_option


@click.group(cls=FriendlyGroup)
def model() -> None:
    """Inspect the model the runtime loads.

    \b
    Example:
      radixcache model info --model smollm2
    """


@model.command(cls=FriendlyCommand)
@model_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@debug_option
def info(model: str, as_json: bool, debug: bool) -> None:
    """Architecture, parameters, context, tokenizer and KV bytes per token of a model.

    \b
    Example:
      radixcache model info
      radixcache model info --model path/to/hf_dir --json
    """
    facts = model_facts(load_engine_model(model))
    if as_json:
        json.dump(facts, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    table = Table(title=Text(facts["name"]), title_justify="left", show_header=False)
    table.add_column("")
    table.add_column("", justify="right")
    for key, value in facts.items():
        if key == "name":
            continue
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
        table.add_row(key.replace("_", " "), Text(shown))  # text, not markup: the source is the user's path
    Console().print(table)


def model_facts(loaded: Any) -> dict[str, Any]:
    """Plain facts about a loaded model (radixcache.runtime.loading.LoadedModel)."""
    from radixcache.runtime.engine.engine import DEFAULT_KV_MEMORY
    from radixcache.runtime.kv.pool import parse_memory

    c, tok = loaded.config, loaded.tokenizer
    parameters = sum(w.numel() for w in loaded.weights.values())
    kv_fp32 = c.kv_bytes_per_token(4)
    return {
        "name": c.name,
        "source": loaded.source,
        "architecture": c.arch,
        "parameters": parameters,
        "layers": c.num_layers,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "attention_heads": c.num_heads,
        "kv_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab_size,
        "context_tokens": c.max_position,
        "rope_theta": c.rope_theta,
        "rope_scaling": rope_scaling_fact(c.rope_scaling),
        "tied_embeddings": c.tie_embeddings,
        "kv_bytes_per_token_fp32": kv_fp32,
        "kv_bytes_per_token_bf16": c.kv_bytes_per_token(2),
        "kv_tokens_in_default_budget": parse_memory(DEFAULT_KV_MEMORY) // kv_fp32,
        "eos_token_ids": list(c.eos_token_ids),
        "chat_template": bool(getattr(tok, "chat_template", None)),
    }


def rope_scaling_fact(scaling: Any) -> str:
    """The RoPE scaling in short: none, or its kind and factor ("llama3 x32", "yarn x4"), "+ rope_freqs" when a GGUF
    file's per-frequency factors apply ("rope_freqs" alone without a kind)."""
    if scaling is None:
        return "none"
    kind = "" if scaling.kind == "default" else f"{scaling.kind} x{scaling.factor:g}"
    freqs = "rope_freqs" if scaling.freq_factors else ""
    return " + ".join(part for part in (kind, freqs) if part)
