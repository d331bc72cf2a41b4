"""Every fenced command in README.md and docs/*.md runs as shown.

What runs: ```bash, ```sh and ```shell fences with bash (`set -euo pipefail`), ```python fences with this
interpreter; other fences (json, text) are not run. Each document gets one scratch directory that mirrors the
repository (symlinks to its top-level entries, and `../shared` when the repository has a sibling `shared/`),
and its blocks run there in order, with `.venv/bin` first on PATH so a bare `radixcache` is the installed
command. So a block may use files an earlier block of the same document wrote.

Markers: an HTML comment on the line just above a fence, `<!-- doc-test: KEY[=VALUE]; KEY[=VALUE] -->`:

- `skip=REASON`: not run (it installs packages, is the test run itself, or is interactive).
- `cheap=ARGS`: ARGS is appended to every `radixcache replay` command of the block: the cheap variant of a
  command that would take minutes (e.g. `--limit 1 --max-tokens 4`). Options given twice take the last value.
- `tiny`: the block runs with RADIXCACHE_MODEL set to a tiny random checkpoint (bash; `--model` defaults to
  it), or with the literal "smollm2" replaced by its path (python). The command's wiring is tested in a
  second instead of loading SmolLM2 again; test_replay_cli.py runs the real model.
- `file=NAME`: not run; the fence's content is written to NAME in the scratch directory, so the format
  examples of docs/traces.md are the inputs of the commands that follow them.
- `none=REASON`, on a line of its own anywhere in a document: the document runs no command, and REASON says why
  (a map with no commands, benchmarks of minutes only, ...). A document that runs no command without this marker
  fails (so a document whose commands all fall to EXTERNAL_SKIPS or skip markers cannot pass by running nothing),
  and so does one that carries it but runs a command (a stale reason).

Consecutive steps run in one interpreter when nothing of the shell is needed: in a run of bash steps whose every
line is a plain `radixcache ARGS` or `python scripts/NAME.py ARGS` (no pipe, redirection, variable or `&&`),
possibly fed by `printf 'LITERAL' | `, and python steps, each radixcache line calls the same click entry point as
the installed command, each script line runs the script as `__main__` (its argv, its folder first on sys.path),
their exit codes checked, a printf's output (the shell's printf makes it) is the command's standard input (and a
command must read it), and each python step executes in a fresh namespace, in order; RADIXCACHE_MODEL is set to
the tiny checkpoint for the steps with the `tiny` marker and unset for the others, as their own processes would
have it. The same commands, in the same order, in the same directory and environment; a process start (Python,
torch) per run instead of per command.
Blocks with shell syntax, and the README's main command, run in bash as written.

`bash scripts/setup.sh && ` before a command is dropped: .ci/run has just run it, and running it again would
reinstall the virtual environment under the running tests. In documents other engineers own, bash fences run
command by command (each with its fence's markers), except those EXTERNAL_SKIPS names (installs, benchmarks and
sweeps that take minutes, and inputs the document never creates); Python fences run whole in every document, unless
marked `skip` (a sketch, one that needs a server, one another test runs). Commands and Python fences that read
`../shared/` are left out when the clone has no sibling `shared/` (the Mooncake trace tests skip then too).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.doc_blocks import (
    MY_DOCS,
    REPO,
    SETUP_PREFIX,
    Block,
    blocks,
    cheapen,
    check_runs_or_says_why,
    commands,
    env,
    plan,
    scratch,
)

_PLAIN = re.compile(r"^\s*(?:\.venv/bin/)?radixcache\s")
_SCRIPT = re.compile(r"^\s*(?:\.venv/bin/)?python\s+(scripts/[\w./-]+\.py)(?:\s|$)")  # a repository script
_PRINTF = re.compile(r"^\s*(printf\s+'[^']*')\s*\|(.*)$")  # printf 'LITERAL' | COMMAND (no shell expansion)
_SHELL = re.compile(r"[|<>;&$`]")
_BATCH_RUNNER = """
import io, json, os, runpy, sys
from radixcache.cli.main import main
for kind, where, item in json.loads(sys.argv[1]):
    print(f"--- {where}", flush=True)
    if kind == "python":
        exec(compile(item, where, "exec"), {"__name__": "__main__"})
        continue
    if kind == "model":  # the step's RADIXCACHE_MODEL: the tiny checkpoint, or none
        os.environ.pop("RADIXCACHE_MODEL", None)
        os.environ.update({"RADIXCACHE_MODEL": item} if item else {})
        continue
    if kind == "stdin":  # the next command reads these bytes as its standard input (what the pipe gives it)
        piped = io.BytesIO(item.encode("latin-1"))
        sys.stdin = io.TextIOWrapper(piped)
        continue
    if kind == "script":  # as `python SCRIPT ARGS` would: its argv, its folder first on sys.path, __main__
        argv, path = sys.argv, sys.path[:]
        sys.argv, sys.path[0:0] = list(item), [os.path.dirname(os.path.abspath(item[0]))]
        try:
            runpy.run_path(item[0], run_name="__main__")
        except SystemExit as stop:
            if stop.code not in (0, None):
                print(f"{where}: python {' '.join(item)} exited with {stop.code}", file=sys.stderr)
                raise
        finally:
            sys.argv, sys.path[:], sys.stdin = argv, path, sys.__stdin__
        continue
    try:
        main.main(item, prog_name="radixcache")
    except SystemExit as stop:
        if stop.code not in (0, None):
            print(f"{where}: radixcache {' '.join(item)} exited with {stop.code}", file=sys.stderr)
            raise
    if sys.stdin is not sys.__stdin__ and piped.getbuffer().nbytes and piped.tell() == 0:
        sys.exit(f"{where}: radixcache {' '.join(item)} did not read the standard input piped into it")
    sys.stdin = sys.__stdin__
"""


def _script(block: Block) -> str:
    script = block.text.replace(SETUP_PREFIX, "")
    return cheapen(script, block.markers["cheap"]) if "cheap" in block.markers else script


@dataclass
class Call:
    """One line of a bash block that the batch runner can run in its interpreter: `radixcache ARGS` ("cli") or
    `python scripts/NAME.py ARGS` ("script"), its argv without the program, and `printf` (the literal
    `printf '...'` piped into it, if any: its output is the command's standard input)."""

    kind: str
    argv: list[str]
    printf: str | None = None


def calls(block: Block) -> list[Call] | None:
    """Each line of `block` as a Call when every line is a plain `radixcache` command, a `python scripts/NAME.py`
    command or `printf 'LITERAL' | ` one of those, else None (it needs a shell)."""
    if block.lang == "python":
        return None
    joined = _script(block).replace("\\\n", " ")  # continuation lines are one command
    lines = [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    out = []
    for line in lines:
        command, printf = line.split(" #", 1)[0], None
        if (piped := _PRINTF.match(command)) is not None:
            printf, command = piped.group(1), piped.group(2)
        if not (_PLAIN.match(command) or _SCRIPT.match(command)) or _SHELL.search(command):
            return None
        out.append(Call("cli" if _PLAIN.match(command) else "script", shlex.split(command)[1:], printf))
    return out or None


def in_process(block: Block) -> list[list[str]] | None:
    """The argv of each line when `block` is only lines that `calls` takes, else None (it needs a shell)."""
    found = calls(block)
    return None if found is None else [call.argv for call in found]


def batches(steps: list[Block]) -> list[tuple[str | None, list[Block]]]:
    """Consecutive steps that one interpreter can run, as (kind, steps) in order: kind "python", "cli" or "mixed"
    (python and cli steps, with or without the `tiny` marker), or None for a step that runs alone (needs a shell,
    or is the README's main command, which runs exactly as a user types it)."""
    out: list[tuple[str | None, list[Block]]] = []
    for step in steps:
        kind = "python" if step.lang == "python" else "cli" if in_process(step) is not None else None
        if step.doc == "README.md" and "cheap" in step.markers and "tiny" not in step.markers:
            kind = None
        key = None if kind is None else "batch"
        if key is not None and out and out[-1][0] == key:
            out[-1][1].append(step)
        else:
            out.append((key, [step]))
    return [(None if key is None else _kind(group), group) for key, group in out]


def _kind(group: list[Block]) -> str:
    langs = {"python" if step.lang == "python" else "cli" for step in group}
    return langs.pop() if len(langs) == 1 else "mixed"


def run_batch(kind: str | None, group: list[Block], cwd: Path, tiny_dir: Path) -> None:
    """Run one of `batches`: a lone step as written (bash, or its own interpreter), else all in one interpreter."""
    first = group[0]
    tiny = tiny_dir if "tiny" in first.markers else None
    if kind is None:
        if first.lang == "python":
            cmd = [sys.executable, "-c", _python(first, tiny_dir)]
        else:
            cmd = ["bash", "-c", "set -euo pipefail\n" + _script(first)]
        what = cmd[-1]
    else:
        items: list[tuple[str, str, object]] = []
        for step in group:
            where = f"{step.doc}:{step.line}"
            items.append(("model", where, str(tiny_dir) if "tiny" in step.markers else ""))
            if step.lang == "python":
                items.append(("python", where, _python(step, tiny_dir)))
            else:
                for call in calls(step) or []:
                    if call.printf is not None:  # the shell's own printf makes the bytes
                        printf = subprocess.run(["bash", "-c", call.printf], capture_output=True, check=True)
                        items.append(("stdin", where, printf.stdout.decode("latin-1")))
                    items.append((call.kind, where, call.argv))
        cmd = [sys.executable, "-c", _BATCH_RUNNER, json.dumps(items)]
        program = {"cli": "radixcache ", "script": "python ", "stdin": "stdin: ", "python": "", "model": "model: "}
        what = "\n".join(f"{w}: {program[k]}{i if isinstance(i, str) else shlex.join(i)}" for k, w, i in items)
        tiny = None  # each step sets its own (a "model" item)
    done = subprocess.run(
        cmd, cwd=cwd, env=env(tiny), capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )
    output = f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"{first.doc}:{first.line} failed ({done.returncode}):\n{what}\n{output}"


def _python(block: Block, tiny_dir: Path) -> str:
    return block.text.replace('"smollm2"', repr(str(tiny_dir))) if "tiny" in block.markers else block.text


def _docs() -> list[str]:
    return sorted({*MY_DOCS, *(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))})


@pytest.mark.slow
@pytest.mark.parametrize("doc", _docs())
def test_fenced_commands_run_as_shown(doc: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    check_runs_or_says_why(doc)
    cwd = scratch(tmp_path)
    steps = plan(doc, with_shared=(REPO.parent / "shared").is_dir())
    ran, pending = 0, []
    for step in [*steps, None]:
        if step is not None and "file" not in step.markers:
            pending.append(step)
            continue
        for kind, group in batches(pending):  # a file step, or the end: run what came before it, in order
            run_batch(kind, group, cwd, tiny_model_dir)
            ran += len(group)
        pending = []
        if step is not None:
            (cwd / step.markers["file"]).write_text(step.text, encoding="utf-8")
    if ran == 0 and commands(doc):
        pytest.skip(f"{doc}: every command reads ../shared/, which this clone does not have beside it")


@pytest.mark.parametrize("doc", _docs())
def test_each_document_runs_a_command_or_says_why_not(doc: str) -> None:
    check_runs_or_says_why(doc)


def test_a_document_that_silently_runs_nothing_fails(tmp_path: Path) -> None:
    bench = "```bash\n.venv/bin/python scripts/bench_engine.py\n```\n"  # an EXTERNAL_SKIPS command only
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "silent.md").write_text(f"# Silent\n\n{bench}", encoding="utf-8")
    with pytest.raises(AssertionError, match="no command runs"):
        check_runs_or_says_why("docs/silent.md", tmp_path)
    skipped = "<!-- doc-test: skip=needs a server -->\n```bash\nradixcache serve\n```\n"
    (tmp_path / "docs" / "skipped.md").write_text(f"# Skipped\n\n{skipped}", encoding="utf-8")
    with pytest.raises(AssertionError, match="no command runs"):
        check_runs_or_says_why("docs/skipped.md", tmp_path)
    said = "# Said\n\n<!-- doc-test: none=benchmarks of minutes only -->\n\n" + bench
    (tmp_path / "docs" / "said.md").write_text(said, encoding="utf-8")
    check_runs_or_says_why("docs/said.md", tmp_path)
    stale = "# Stale\n\n<!-- doc-test: none=nothing runs -->\n\n```bash\nradixcache --help\n```\n"
    (tmp_path / "docs" / "stale.md").write_text(stale, encoding="utf-8")
    with pytest.raises(AssertionError, match="its marker says it runs none"):
        check_runs_or_says_why("docs/stale.md", tmp_path)
    assert [b.text for b in commands("docs/stale.md", tmp_path)] == ["radixcache --help\n"]


def test_the_marker_helpers() -> None:
    script = "radixcache replay --compare   # both\nradixcache replay x.jsonl | tee out\n"
    assert cheapen(script, "--limit 1") == (
        "radixcache replay --compare --limit 1 # both\nradixcache replay x.jsonl --limit 1 | tee out\n"
    )
    plain = Block("docs/x.md", 1, "bash", "radixcache trace stats a.jsonl   # a comment\n.venv/bin/radixcache --help\n")
    assert in_process(plain) == [["trace", "stats", "a.jsonl"], ["--help"]]
    for shell in ("radixcache replay | tee out\n", "radixcache replay > out\n", "X=1 radixcache replay\n"):
        assert in_process(Block("docs/x.md", 1, "bash", shell)) is None, shell
    fed = Block("docs/x.md", 2, "bash", "printf 'Hi!\\n/exit\\n' | radixcache chat --system \"Be terse.\"  # a chat\n")
    assert [(c.kind, c.argv, c.printf) for c in calls(fed) or []] == [
        ("cli", ["chat", "--system", "Be terse."], "printf 'Hi!\\n/exit\\n'")
    ]
    for shell in (
        'printf "$X" | radixcache chat\n',
        "printf 'a' | radixcache chat | tee out\n",
        "echo a | radixcache chat\n",
    ):
        assert calls(Block("docs/x.md", 2, "bash", shell)) is None, shell
    plot = Block("docs/x.md", 2, "bash", ".venv/bin/python scripts/plot_replay.py r.json --out r.png  # a plot\n")
    assert in_process(plot) == [["scripts/plot_replay.py", "r.json", "--out", "r.png"]]
    for shell in ("python scripts/plot_replay.py r.json > out\n", ".venv/bin/python -m pytest\n", "python x.py\n"):
        assert in_process(Block("docs/x.md", 2, "bash", shell)) is None, shell
    snippet = Block("docs/x.md", 5, "python", "print(1)\n")
    main_command = Block("README.md", 9, "bash", "radixcache replay\n", {"cheap": "--limit 1"})
    piped = Block("docs/x.md", 7, "bash", "radixcache replay | tee out\n")
    kinds = [(kind, [b.line for b in group]) for kind, group in batches([plain, plain, snippet, piped, main_command])]
    assert kinds == [("mixed", [1, 1, 5]), (None, [7]), (None, [9])]
    tiny_snippet = Block("docs/x.md", 11, "python", "print(2)\n", {"tiny": ""})
    kinds = [(kind, [b.line for b in group]) for kind, group in batches([plain, tiny_snippet, snippet, snippet])]
    assert kinds == [("mixed", [1, 11, 5, 5])]  # tiny and other steps share an interpreter (RADIXCACHE_MODEL per step)
    readme = blocks("README.md")
    assert any("radixcache replay" in b.text and "cheap" in b.markers for b in readme)
    ci = (REPO / ".ci" / "run").read_text()
    test_command = "bash scripts/setup.sh && .venv/bin/python -m pytest -q -n 2 --dist loadgroup"
    assert test_command in ci and any(test_command in b.text for b in readme), "README's test command is .ci/run's"


def test_a_failing_command_in_a_batch_fails_its_document(tmp_path: Path) -> None:
    fine = Block("docs/x.md", 3, "bash", "radixcache --help\n")
    broken = Block("docs/x.md", 8, "bash", "radixcache trace stats missing.jsonl\nradixcache --help\n")
    [(kind, group)] = batches([fine, broken])
    with pytest.raises(AssertionError, match=r"docs/x.md:8: radixcache trace stats missing.jsonl exited with 1"):
        run_batch(kind, group, tmp_path, tmp_path)
    plot = Block("docs/x.md", 12, "bash", ".venv/bin/python scripts/plot_replay.py missing.json\nradixcache --help\n")
    [(kind, group)] = batches([fine, plot])
    with pytest.raises(AssertionError, match=r"docs/x.md:12: python scripts/plot_replay.py missing.json exited with 1"):
        run_batch(kind, group, scratch(tmp_path), tmp_path)
    has_model = f"import os\nassert os.environ['RADIXCACHE_MODEL'] == {str(tmp_path)!r}\n"
    no_model = "import os\nassert 'RADIXCACHE_MODEL' not in os.environ\n"
    tiny, other = Block("docs/x.md", 9, "python", has_model, {"tiny": ""}), Block("docs/x.md", 9, "python", no_model)
    [(kind, group)] = batches([other, tiny, other, fine, tiny])
    run_batch(kind, group, tmp_path, tmp_path)  # each step sees its own RADIXCACHE_MODEL
    [(kind, group)] = batches([tiny, Block("docs/x.md", 10, "python", has_model)])
    with pytest.raises(AssertionError, match=r'File "docs/x.md:10", line 2'):  # the untiny step sees no model
        run_batch(kind, group, tmp_path, tmp_path)
    unread = Block("docs/x.md", 15, "bash", "printf 'a\\n' | radixcache --help\n")  # --help reads no input
    [(kind, group)] = batches([fine, unread])
    with pytest.raises(AssertionError, match=r"docs/x.md:15: radixcache --help did not read the standard input"):
        run_batch(kind, group, tmp_path, tmp_path)


def test_python_fences_run_in_every_document_unless_skipped(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    fences = [
        "```python\nprint(1)\n```\n",
        "<!-- doc-test: skip=a sketch -->\n```python\nawait x\n```\n",
        "```python\nopen('../shared/t')\n```\n",
    ]
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n" + "\n".join(fences), encoding="utf-8")
    assert [b.text for b in commands("docs/other.md", tmp_path)] == ["print(1)\n", "open('../shared/t')\n"]
    assert [b.text for b in commands("docs/other.md", tmp_path, with_shared=False)] == ["print(1)\n"]
    marked = "<!-- doc-test: cheap=--limit 1; tiny -->\n```bash\nradixcache replay\nradixcache model info\n```\n"
    (tmp_path / "docs" / "marked.md").write_text(marked, encoding="utf-8")
    steps = commands("docs/marked.md", tmp_path)  # command by command, each with its fence's markers (were dropped)
    assert [(b.text, b.markers) for b in steps] == [
        ("radixcache replay\n", {"cheap": "--limit 1", "tiny": ""}),
        ("radixcache model info\n", {"cheap": "--limit 1", "tiny": ""}),
    ]
