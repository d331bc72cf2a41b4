"""The fenced blocks of README.md and docs/*.md, their doc-test markers, and the scratch directory and environment
their commands run in: what tests/cli/test_docs_commands.py runs (its docstring says how)."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MY_DOCS = ("README.md", "docs/traces.md", "docs/cli.md", "docs/api.md", "docs/tiers.md")
EXTERNAL_SKIPS = {
    "pip install": "installs packages",
    "bench_tree.py": "a benchmark of minutes",
    "bench_runtime.py": "a benchmark of minutes",
    "bench_engine.py": "a benchmark of minutes",
    "bench_server.py": "a benchmark of minutes",
    "bench_goodput.py": "a benchmark of minutes",
    "bench_tiers.py": "a benchmark of minutes",
    "soak_server.py": "a soak of minutes",
    "profile_decode.py": "a profile of minutes",
    "eval_quant.py": "an evaluation of minutes",
    "simulate_eviction.py": "a sweep of minutes",
    " chat.jsonl": "reads an input file the document does not create",
    "sharegpt.json": "reads an input file the document does not create",
}
SETUP_PREFIX = "bash scripts/setup.sh && "
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    text: str
    markers: dict[str, str] = field(default_factory=dict)


def blocks(doc: str, root: Path = REPO) -> list[Block]:
    """The fenced blocks of a document, with the markers just above each."""
    lines = (root / doc).read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start, lang = i, m.group(1)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        markers: dict[str, str] = {}
        above = lines[start - 1] if start > 0 else ""
        if (mm := _MARKER.match(above)) is not None:
            for item in filter(None, (p.strip() for p in mm.group(1).split(";"))):
                key, _, value = item.partition("=")
                markers[key.strip()] = value.strip()
        found.append(Block(doc, start + 1, lang, "\n".join(lines[start + 1 : end]) + "\n", markers))
        i = end + 1
    return found


def no_command_reason(doc: str, root: Path = REPO) -> str | None:
    """The REASON of a document's `<!-- doc-test: none=REASON -->` line, if it has one."""
    for line in (root / doc).read_text(encoding="utf-8").splitlines():
        if (m := _MARKER.match(line.strip())) is not None:
            for item in filter(None, (p.strip() for p in m.group(1).split(";"))):
                key, _, value = item.partition("=")
                if key.strip() == "none":
                    return value.strip()
    return None


def plan(doc: str, root: Path = REPO, with_shared: bool = True) -> list[Block]:
    """What the test does with `doc`, in order: `file` blocks to write and the commands to run (as Blocks).

    Python fences run whole, in every document; bash fences of the documents this test's author keeps (MY_DOCS)
    run fence by fence, the others' command by command, less EXTERNAL_SKIPS. When `with_shared` is false, what
    reads `../shared/` (a command, or a Python fence) is left out.
    """
    steps: list[Block] = []
    for block in blocks(doc, root):
        if "file" in block.markers:
            steps.append(block)
            continue
        if block.lang not in ("bash", "sh", "shell", "python") or "skip" in block.markers:
            continue
        if block.lang == "python":
            if "../shared/" not in block.text or with_shared:
                steps.append(block)
            continue
        if doc in MY_DOCS:
            steps.append(block)
            continue
        for command in block.text.replace("\\\n", " ").splitlines():
            if not command.strip() or command.lstrip().startswith("#"):
                continue
            if any(needle in command for needle in EXTERNAL_SKIPS):
                continue
            if "../shared/" in command and not with_shared:
                continue  # a clone without the shared traces beside it: nothing to read
            steps.append(Block(doc, block.line, "bash", command + "\n", block.markers))  # `tiny`, `cheap` apply
    return steps


def commands(doc: str, root: Path = REPO, with_shared: bool = True) -> list[Block]:
    return [step for step in plan(doc, root, with_shared) if "file" not in step.markers]


def check_runs_or_says_why(doc: str, root: Path = REPO) -> None:
    """A document runs at least one command, or says in a `none=` marker why it runs none (and not both)."""
    count, reason = len(commands(doc, root)), no_command_reason(doc, root)
    if count == 0:
        assert reason, f"{doc}: no command runs, and no `<!-- doc-test: none=REASON -->` line says why"
    else:
        assert reason is None, f"{doc}: runs {count} command(s), but its marker says it runs none ({reason})"


def cheapen(script: str, args: str) -> str:
    """Append `args` to every `radixcache replay` command (before a comment, pipe or `&&`)."""
    joined = script.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        at = line.find("radixcache replay")
        if at >= 0:
            ends = [k for k in (line.find(t, at) for t in (" #", " |", " &&", ";")) if k >= 0]
            cut = min(ends) if ends else len(line.rstrip())
            line = f"{line[:cut].rstrip()} {args}{line[cut:]}"
        out.append(line)
    return "\n".join(out) + "\n"


def scratch(tmp: Path) -> Path:
    """A directory that looks like the repository root (and has ../shared), where written files stay."""
    root = tmp / "main"
    root.mkdir(parents=True)
    for entry in REPO.iterdir():
        if entry.name not in (".git",):
            (root / entry.name).symlink_to(entry)
    shared = REPO.parent / "shared"
    if shared.is_dir():
        (tmp / "shared").symlink_to(shared)
    return root


def env(tiny: Path | None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("RADIXCACHE_MODEL", "RADIXCACHE_DEBUG")}
    out["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{out.get('PATH', '')}"
    out["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    if tiny is not None:
        out["RADIXCACHE_MODEL"] = str(tiny)
    return out
