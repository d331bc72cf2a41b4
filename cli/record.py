"""`--record-trace FILE` on `replay` and `serve`: the option, its check before the model loads, and the
`radixcache simulate` command that reproduces a recorded replay (docs/traces.md, "Recording your own traffic")."""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import click

from radixcache.cli.stdout import STDOUT, is_stdout
from radixcache.runtime.atomic_file import Staging, staging_stem

log = logging.getLogger("radixcache.record")

RECORD_HELP = (
    "Write what the engine served to FILE as a Mooncake-format hash trace (one JSONL line per request: arrival and "
    "finish, lengths, chained page hashes, session; never text or token ids), for `radixcache simulate`."
)

CONCURRENT_NOTE = (
    "(close, not exact, with requests side by side: the simulator runs each between its recorded arrival and finish "
    "and shares its prompt's pages from its start, as the engine does, but the engine's own timing can move an "
    "eviction)"
)

INTERRUPTED_NOTE = (
    "(interrupted: the trace may also hold the requests Ctrl-C cut short, which the engine served as far as they went "
    "and the table leaves out, so the two hit rates can differ)"
)


def record_option(func: Callable) -> Callable:
    """--record-trace FILE."""
    return click.option(
        "--record-trace", metavar="FILE", type=click.Path(dir_okay=False, writable=True), help=RECORD_HELP
    )(func)


def check_record_path(path: str | None, option: str = "--record-trace") -> None:
    """Refuse, before the model loads, an output FILE (of `option`) whose folder does not exist or cannot be
    written: found after the run, it would lose the run's results."""
    if path is None:
        return
    if option == "--record-trace" and is_stdout(path):  # a recording is a file the simulate command reads again
        hint = " ('./-' for one named '-')" if path == STDOUT else ""
        raise click.BadParameter(
            f"{path!r} is stdout: a recording is a file for the printed simulate command; give a file name{hint}",
            param_hint=f"'{option}'",
        )
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        raise click.BadParameter(f"the folder {str(folder)!r} does not exist", param_hint=f"'{option}'")
    if not os.access(folder, os.W_OK):
        raise click.BadParameter(f"the folder {str(folder)!r} is not writable", param_hint=f"'{option}'")


def check_distinct_files(trace: str | None, outputs: dict[str, str | None]) -> None:
    """Refuse output files (by option) that are the same file as each other or as the TRACE read: the later write
    would replace the earlier (the JSON the recorded trace, which `recorded FILE` then names), or the run would
    overwrite its own input."""
    seen: dict[object, str] = {} if trace is None else {_identity(trace): "TRACE"}
    for option, path in outputs.items():
        if path is None:
            continue
        key = _identity(path)
        if key in seen:
            raise click.BadParameter(f"{path!r} is also {seen[key]}: give another file", param_hint=f"'{option}'")
        seen[key] = option


def _identity(path: str) -> object:
    """What makes two paths one file: the device and inode of one that exists (a hard link or a bind mount too, which
    `--json` truncated along with the trace it names), else its real path."""
    try:
        st = os.stat(path)
    except OSError:
        return os.path.realpath(path)
    return (st.st_dev, st.st_ino)


class StagedRecording:
    """A recording that replaces FILE only once it holds a line: the recorder writes to `staging` (a hidden file
    beside FILE, `.FILE.<pid>.partial`: radixcache.runtime.atomic_file's `Staging`), which `place` syncs and moves
    onto FILE at its first line, so a run that fails or records nothing leaves an earlier recording at FILE as it
    was. The recorder writes on through its open file after the move, so from then on a killed process leaves its
    whole lines in FILE (docs/traces.md); `finish` syncs them. A FILE that exists and is no regular file (a pipe,
    /dev/stdout) is written directly: it holds no recording to keep, and cannot be replaced by a rename; so is a
    FILE whose name leaves no room for the staging file's (`staging_stem`). Making one removes the staging files of FILE
    that killed runs left (`remove_stale_partials`), and creates this one's, locked (flock) until `finish`, so that
    no other run takes it for stale."""

    def __init__(self, path: str) -> None:
        self.path = os.path.realpath(path)  # a symlink's target is replaced, as opening it for writing would
        folder, name = os.path.split(self.path)
        direct = os.path.exists(self.path) and not os.path.isfile(self.path)
        direct = direct or staging_stem(folder, name, str(os.getpid())) != name  # ENAMETOOLONG after the load
        self._staging = None if direct else Staging(self.path, unique=False)
        self.staging = self.path if self._staging is None else self._staging.path
        self.placed = direct
        self.error: str | None = None  # why the move onto FILE failed: the recording stays in `staging`

    def place(self) -> None:
        """Sync the staging file and move it onto FILE if it holds a line and has not been moved yet. A move the
        folder refuses (FILE another user's, in a sticky folder such as /tmp) raised out of the run's callback and
        ended it, all its results lost; it sets `error` instead, and the recording goes on in `staging`, which
        `finish` keeps."""
        if self.placed or self.error is not None or self._staging is None:
            return
        if os.path.isfile(self.staging) and os.path.getsize(self.staging) > 0:
            try:
                self._staging.commit()
            except OSError as exc:
                if not self._staging.committed:
                    self.error = exc.strerror or str(exc)
                    return
                log.warning("recording %s may not be whole on disk (%s)", self.path, exc.strerror or exc)
            self.placed = True  # moved, its folder's fsync failing after (EIO) or not

    def finish(self) -> bool:
        """After the recording closed: place what it wrote and sync it, else remove the empty staging file. True:
        FILE written."""
        staging = self._staging
        try:
            self.place()
            if staging is not None and (self.placed or self.error is not None):
                try:
                    staging.sync()  # the lines written since the move: a power cut now keeps them
                except OSError as exc:
                    log.warning("recording %s may not be whole on disk (%s)", self.path, exc.strerror or exc)
            elif staging is not None:
                staging.discard()
        finally:
            if staging is not None:
                staging.close()  # the lock goes with it
        return self.placed


class EngineShape(NamedTuple):
    """What `simulate_command` needs of an engine that is not a replay's summary (a server's)."""

    capacity_blocks: int
    policy: str
    page_size: int


DISK_NOTE = (
    "(the command leaves out the engine's disk tier, whose hits the engine's hit rate counts: a disk tier can hold "
    "pages of earlier runs, which no recording shows)"
)


#: the engine's prefill pass (runtime.engine.scheduler_config.SchedulerConfig.prefill_chunk, which no command sets)
ENGINE_PREFILL_CHUNK = 512

REUSE_NOTE = (
    "(the reuse policy learns from each insert: --prefill-chunk replays the engine's, the prompt a prefill pass at a "
    "time and each page a decode fills; with tiers or admission, which it does not model, or passes the engine cut "
    "short (while it measured its threads, or beside other requests' decodes), the hit rate can differ a little)"
)


def command_notes(policy: str, tiers: Any) -> list[str]:
    """What the printed simulate command cannot reproduce of a run under `policy` over `tiers` (the engine's)."""
    notes = [DISK_NOTE] if getattr(tiers, "disk", None) is not None else []
    return [*notes, REUSE_NOTE] if policy == "reuse" else notes


def simulate_command(path: str, summary: Any, admission: str | None = None, tiers: Any = None) -> str:
    """The `radixcache simulate` command that replays a recorded run through the tree alone: the engine's pool size,
    policy and page size (`summary`: a replay's, or anything with those attributes), its admission policy unless
    it adopted every page, and its host tier (`tiers`: the engine's `tiers`, None for none): its pages and write
    policy, without which the command gave the device's hit rate alone for a run whose hit rate counted the host's
    hits too. No disk tier (DISK_NOTE). No `--concurrency`: each recorded line says when its request arrived and when
    it finished, which the simulator follows. (A recorded request holds, while it runs in the simulator, one block
    for the partial page the engine was writing.)"""
    shown = os.path.join(".", path) if path.startswith("-") else path  # else read as an option ('-r')
    args = ["radixcache", "simulate", shlex.quote(shown), "--capacity-blocks", str(summary.capacity_blocks)]
    args += ["--policy", summary.policy, "--block-size", str(summary.page_size)]
    if admission not in (None, "all"):
        args += ["--admission", str(admission)]
    elif summary.policy == "reuse" and getattr(tiers, "host", None) is None:  # where the simulator models them
        args += ["--prefill-chunk", str(ENGINE_PREFILL_CHUNK)]
    host = getattr(tiers, "host", None)
    if host is not None:
        args += ["--host-capacity-blocks", str(host.capacity)]
        policy = tiers.tiered.write_policy
        if policy != "write_through":  # simulate's default
            args += ["--write-policy", str(policy)]
    return " ".join(args)
