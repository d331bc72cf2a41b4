"""`replay --json FILE` replaces FILE whole (cli.replay._write_json through radixcache.runtime.atomic_file)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_json_write_that_fails_part_way_keeps_the_earlier_json_whole(tmp_path: Path) -> None:
    """--json opened FILE for writing (emptying it) and wrote the run's JSON into it: a disk that filled part way
    (here the process's file size limit) left an earlier run's JSON cut short, unreadable by `trace stats` and the
    plot script. Now the JSON replaces FILE whole or not at all, and the reason is returned for the report."""
    path = tmp_path / "r.json"
    path.write_text('{"summary": {"requests": 1}}\n')
    code = """
        import json, resource, signal, sys
        from radixcache.cli.replay import _write_json
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        print(json.dumps(_write_json(sys.argv[1], {"requests": [{"text": "x" * 100}] * 1000})))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == "File too large"
    assert json.loads(path.read_text()) == {"summary": {"requests": 1}}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
