"""bench_runtime.py's contenders: ours in each `--quant` mode, transformers and llama.cpp (each optional, loaded
once before any round), and the raw decode step of ours without the engine."""

from __future__ import annotations

import contextlib
import io
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from bench_runtime_report import row
from bench_runtime_rounds import PAGE, Settings, prompt_ids, timed, timed_once

from radixcache.runtime.kv.mirror import DecodeMirror
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel


@dataclass
class Ours:
    mode: str
    model: LlamaModel

    @property
    def tag(self) -> str:
        return "fp32" if self.mode == "none" else self.mode


@dataclass
class HF:
    model: Any
    label: str

    def forward_ms(self, ids: torch.Tensor) -> dict[str, float]:
        # The prompt's forward pass producing the last logits, as ours does: no KV cache kept, no sampling.
        with torch.inference_mode():
            sec = timed_once(lambda: self.model(input_ids=ids, use_cache=False, logits_to_keep=1))
        return {"ms": sec * 1000}

    def generate_ms(self, ids: torch.Tensor, n: int) -> dict[str, float]:
        """generate(1) and generate(n) of the same prompt in the same round: their difference is the decode."""
        mask = torch.ones_like(ids)

        def gen(k: int) -> None:
            with torch.inference_mode():
                self.model.generate(
                    ids, attention_mask=mask, max_new_tokens=k, min_new_tokens=k, do_sample=False, pad_token_id=0
                )

        return {
            "ms generate(1)": timed_once(lambda: gen(1)) * 1000,
            f"ms generate({n})": timed_once(lambda: gen(n)) * 1000,
        }


@dataclass
class LlamaCpp:
    llm: Any
    label: str

    def eval_ms(self, ids: list[int]) -> dict[str, float]:
        def run() -> None:
            self.llm.reset()  # n_tokens = 0: the next eval overwrites the KV from position 0
            self.llm.eval(ids)

        return {"ms": timed_once(run) * 1000}

    def decode_tps(self, prompt: list[int], new: list[int]) -> dict[str, float]:
        self.llm.reset()
        self.llm.eval(prompt)
        t = time.perf_counter()
        for tok in new:
            self.llm.eval([tok])
        return {"tok/s": len(new) / (time.perf_counter() - t)}


def load_llama_cpp(path: str, s: Settings) -> LlamaCpp | None:
    try:
        import llama_cpp
    except ImportError as exc:
        msg = f"llama-cpp-python is not importable ({exc}): .venv/bin/pip install llama-cpp-python"
        print(f"  SKIPPED llama.cpp: {msg}")
        row("llama.cpp", "not measured", "", msg)
        return None
    llm = llama_cpp.Llama(
        model_path=path,
        n_ctx=max(4096, s.long_prompt + s.decode_tokens + 64),  # the longest prompt it is given, and its tokens
        n_threads=s.threads,
        n_threads_batch=s.threads,
        n_batch=512,
        verbose=False,
        logits_all=False,
    )
    return LlamaCpp(llm, f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, {os.path.basename(path)})")


def load_hf(path: str) -> HF | None:
    try:
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        msg = "transformers is not installed: .venv/bin/pip install transformers gguf accelerate"
        print(f"  SKIPPED the transformers comparison: {msg}")
        row("transformers", "not measured", "", msg)
        return None
    folder, name = os.path.split(path)
    with contextlib.redirect_stderr(io.StringIO()):  # its GGUF conversion progress bars would swamp the output
        hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    hf.eval()
    return HF(hf, f"transformers {transformers.__version__} fp32")


class RawStep:
    """`model.decode` on this thread (no engine): `batch` sequences at context `ctx` (the new token included),
    reading the decode mirror as the Engine does (`mirror=True`), or the pages (the gather / in-place paths)."""

    def __init__(self, model: LlamaModel, batch: int, ctx: int, mirror: bool = True) -> None:
        n_pages = -(-ctx // PAGE)
        self.model = model
        self.pool = model.new_pool(batch * n_pages, PAGE)
        tables = [list(range(b * n_pages, (b + 1) * n_pages)) for b in range(batch)]
        vocab = model.config.vocab_size
        with torch.inference_mode():
            for b in range(batch):
                model.prefill(prompt_ids(ctx - 1, vocab, 100 + b), 0, tables[b], self.pool)
        self.meta = build_decode_meta(tables, [ctx] * batch, PAGE, model.device)
        self.toks = prompt_ids(batch, vocab, 9)
        self.step = None
        if mirror:  # filled once; every timed step then rewrites the same position, as a steady-state step writes one
            rows = DecodeMirror(model.config, model.dtype, model.device, 1 << 40, native=model.native)
            self.step = rows.prepare(list(range(batch)), tables, [ctx] * batch, self.pool)

    def step_ms(self, steps: int) -> dict[str, float]:
        """Fastest of `steps` steps after one untimed step (the previous contender left the caches cold)."""
        with torch.inference_mode():
            sec = timed(lambda: self.model.decode(self.toks, self.meta, self.pool, self.step), steps)
        return {"ms/step": sec * 1000}


RAW_STEPS_B1 = 5  # raw decode steps timed per round at batch 1 (the fastest counts)
RAW_STEPS_B8 = 3
