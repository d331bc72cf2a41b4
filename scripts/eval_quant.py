"""What quantised weights cost SmolLM2 in quality: perplexity on a held-out text and greedy answers on the fixed
prompt set (radixcache.runtime.quant_eval.FIXED_PROMPTS, the set tests/runtime/engine/test_quant.py checks).

    .venv/bin/python scripts/eval_quant.py                          # GPL-3 text, 4096 tokens, every mode
    .venv/bin/python scripts/eval_quant.py --text book.txt --max-tokens 2048 --quant none,fp16

Prints one markdown table: mode, perplexity (windows of 512 tokens every 256), its change against "none",
how many greedy answers (16 new tokens) equal the "none" answers token for token, and the seconds each mode took.
The gguf mode runs its block kernel only for up to 8 rows, so its perplexity is computed in prefill chunks of 4
tokens (every product through the kernel); the other modes use chunks of 512. `$RADIXCACHE_GGUF_ACTIVATIONS`
picks that kernel's activations (float, the default; int8 puts every pass, so the perplexity too, on int8):

    RADIXCACHE_GGUF_ACTIVATIONS=int8 .venv/bin/python scripts/eval_quant.py --model /tmp/q4km.gguf --quant none,gguf
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from radixcache.runtime import Engine
from radixcache.runtime.loading import load_model
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.model.quant import QUANT_MODES
from radixcache.runtime.quant_eval import FIXED_PROMPTS, greedy_answers, perplexity

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"  # long English prose that no part of the project uses


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text", default=DEFAULT_TEXT if os.path.exists(DEFAULT_TEXT) else None, help="held-out text")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens of the text to score [4096]")
    p.add_argument("--quant", default=",".join(QUANT_MODES), help="modes to compare, comma-separated")
    p.add_argument("--model", default="smollm2", help="model name or path [smollm2]")
    p.add_argument("--new-tokens", type=int, default=16, help="greedy tokens per prompt [16]")
    args = p.parse_args(argv)
    if args.text is None:
        p.error(f"{DEFAULT_TEXT} does not exist here: give a held-out text with --text PATH")
    modes = [m.strip() for m in args.quant.split(",") if m.strip()]
    bad = [m for m in modes if m not in QUANT_MODES]
    if bad or not modes:
        p.error(f"--quant takes modes from {', '.join(QUANT_MODES)}, got {args.quant!r}")
    if args.max_tokens < 2:
        p.error("--max-tokens must be at least 2")
    args.modes = ["none", *[m for m in modes if m != "none"]]  # the baseline always runs, first
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    loaded = load_model(args.model, keep_blocks="gguf" in args.modes)
    with open(args.text, encoding="utf-8") as f:
        ids = loaded.tokenizer.encode(f.read())[: args.max_tokens]
    print(f"{args.model}: {len(ids)} tokens of {args.text}; {len(FIXED_PROMPTS)} prompts x {args.new_tokens} tokens")
    rows = []
    base_ppl = base_answers = None
    for mode in args.modes:
        t = time.perf_counter()
        blocks = loaded.blocks if mode == "gguf" else None
        model = LlamaModel(loaded.config, loaded.weights, quant=mode, blocks=blocks)
        ppl = perplexity(model, ids, chunk_size=4 if mode == "gguf" else 512)
        engine = Engine(model, tokenizer=loaded.tokenizer, kv_memory="64MiB")
        answers = [r.token_ids for r in greedy_answers(engine, FIXED_PROMPTS, args.new_tokens)]
        seconds = time.perf_counter() - t
        if base_ppl is None:
            base_ppl, base_answers = ppl, answers
        same = sum(a == b for a, b in zip(answers, base_answers, strict=True))
        delta = ppl - base_ppl
        rows.append(
            f"| {mode} | {ppl:.3f} | {delta:+.3f} ({100 * delta / base_ppl:+.2f}%) "
            f"| {same} of {len(answers)} | {seconds:.1f} |"
        )
        print(f"  {mode}: perplexity {ppl:.3f}, answers equal {same}/{len(answers)}, {seconds:.1f}s", flush=True)
    print()
    print("| mode | perplexity | delta vs none | greedy answers equal | seconds |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
