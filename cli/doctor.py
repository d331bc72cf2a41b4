"""`radixcache doctor`: this machine's bandwidth, CPU and torch, the kernels chosen for each weight shape, and a short
batch-1 decode against the bandwidth bound (runtime.doctor)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from radixcache.cli.engine_options import MAX_THREADS, kernel_mode, kernel_options, model_option
from radixcache.cli.errors import FriendlyCommand, debug_option


@click.command(cls=FriendlyCommand)
@model_option
@click.option(
    "--quant",
    default="none",
    show_default=True,
    type=click.Choice(["none", "fp16", "gguf"]),
    help="Weight format of the decode measured (as replay/serve's --quant).",
)
@click.option(
    "--gguf-activations",
    type=click.Choice(["int16-decode", "float", "int16", "int8-decode", "int8", "auto"]),
    help="With --quant gguf, the block kernels' activations (as replay/serve's) [default: "
    "$RADIXCACHE_GGUF_ACTIVATIONS, else int16-decode].",
)
@click.option(
    "--threads",
    type=click.IntRange(1, MAX_THREADS),
    help="torch threads [default: torch's, at most the CPUs this process may use].",
)
@kernel_options()[0]
@kernel_options()[1]
@click.option("--prompt-tokens", default=128, show_default=True, type=click.IntRange(min=1), help="Prompt length.")
@click.option("--tokens", default=32, show_default=True, type=click.IntRange(min=2), help="Tokens decoded (batch 1).")
@click.option(
    "--bandwidth-mb",
    default=256,
    show_default=True,
    type=click.IntRange(min=16, max=8192),
    help="Size of the memory read that measures the bandwidth (larger than the CPU's caches).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@debug_option
def doctor(
    model: str,
    quant: str,
    gguf_activations: str | None,
    threads: int | None,
    kernels: str | None,
    retune_kernels: bool,
    prompt_tokens: int,
    tokens: int,
    bandwidth_mb: int,
    as_json: bool,
    debug: bool,
) -> None:
    """How fast this machine can decode, and how close the engine gets.

    Prints the memory read bandwidth, the CPU and the flags that matter to kernels, torch and its threads, the
    kernel chosen for each weight shape and row count (measured at the first load and cached; --retune-kernels
    measures again), and a batch-1 decode of --model against its bound: bandwidth / bytes of weights per token.

    \b
    Example:
      radixcache doctor
      radixcache doctor --threads 2 --retune-kernels
      radixcache doctor --model path/to/hf_dir --json
      radixcache doctor --model model.Q4_K_M.gguf --quant gguf --gguf-activations int8-decode
    """
    from radixcache.runtime.doctor import diagnose

    mode = kernel_mode(kernels, retune_kernels)
    if gguf_activations is not None and quant != "gguf":
        raise click.UsageError(f"--gguf-activations {gguf_activations} applies to --quant gguf (got --quant {quant})")
    report = diagnose(
        model,
        threads=threads,
        quant=quant,
        kernels=mode,
        prompt_tokens=prompt_tokens,
        new_tokens=tokens,
        bandwidth_mb=bandwidth_mb,
        gguf_activations=gguf_activations,
    ).to_json()
    if as_json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    for line in report_lines(report):
        click.echo(line)


def report_lines(r: dict[str, Any]) -> list[str]:
    """The report as text, one fact per line."""
    flags = " ".join(f"{name}={'yes' if on else 'no'}" for name, on in r["flags"].items())
    loads = r["load_average"]
    lines = [
        f"cpu: {r['cpu']} ({r['cores']} cores usable)",
        f"flags: {flags}",
        f"torch: {r['torch']}, {r['threads']} threads",
        "load average: " + " ".join("-" if v is None else f"{v:.2f}" for v in loads.values()),
        f"read bandwidth: {r['bandwidth_gbs']} GB/s (before the decode {r['bandwidth_read']['before']}, after it "
        f"{r['bandwidth_read']['after']})",
    ]
    k = r["kernels"]
    where = f" ({k['file']})" if k["file"] else ""
    note = f": {k['note']}" if k["note"] else ""
    lines.append(f"kernels: {k['mode']}, {k['source']}{note}{where}")
    for shape, s in k["shapes"].items():
        paths = ", ".join(f"{rows} rows {path}" for rows, path in s["paths"].items())
        speed = ", ".join(f"{p} {g}" for p, g in s["gbs_1_row"].items())
        lines.append(f"  {shape} x{s['layers']}: {paths}" + (f" (1 row, GB/s: {speed})" if speed else ""))
    d = r["decode"]
    mb = r["weight_bytes_per_token"] / 1e6
    lines.append(f"model: {r['model']}, quant {r['quant']}, {mb:.1f} MB of weights a token")
    b = r.get("blocks")
    if b:
        layers = ", ".join(f"{kind} {n}" for kind, n in b["layers"].items()) or "none"
        head = ", ".join(f"{kind} {n}" for kind, n in b["head"].items()) or "dense"
        acts = "/".join(b["layer_activations"]) or "-"
        lines.append(
            f"gguf blocks: layers {layers} (activations {acts}); output head {head} (activations "
            f"{b['head_activations'] or '-'})"
        )
    lines.append(
        f"decode (batch 1, {d['new_tokens']} tokens after {d['prompt_tokens']}): {d['decode_tps']} tok/s; "
        f"bound {d['bound_tps']} tok/s; {100 * d['of_bound']:.0f}% of the bound"
    )
    if not r["bandwidth_read"]["steady"]:
        lines.append(
            "the memory's speed moved during the decode (the two readings differ by more than 10%): its share of "
            "the bound is uncertain; run doctor again"
        )
    return lines
