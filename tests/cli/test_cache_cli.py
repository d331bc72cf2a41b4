"""`radixcache cache stats / verify / clear`: through CliRunner on a real cache directory, no model."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from radixcache.cli.main import main
from radixcache.runtime.kv.tier.disk_store import MARKER_NAME, DiskStore

FP = "tiny/float32/page4"
META = {"dtype": "float32", "shape": [1, 2, 4, 1, 8]}


def h(i: int) -> bytes:
    return hashlib.blake2b(str(i).encode(), digest_size=16).digest()


def page_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.kvpage"))


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    """A cache of 3 pages under FP and 1 under another fingerprint."""
    directory = tmp_path / "kv-cache"
    for fingerprint, ids in ((FP, range(3)), ("other-model", range(3, 4))):
        with DiskStore(directory, max_bytes=1 << 20, fingerprint=fingerprint) as store:
            for i in ids:
                assert store.put(h(i), [i, i + 1, i + 2, i + 3], bytes([i]) * 256, META)
    return directory


def _error_line(result) -> str:
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_stats_prints_pages_per_fingerprint(runner, cache_dir: Path) -> None:
    result = runner.invoke(main, ["cache", "stats", str(cache_dir)])
    assert result.exit_code == 0, result.output
    assert "4 pages" in result.output
    assert FP in result.output and "other-model" in result.output


def test_stats_prints_fingerprints_with_brackets_as_they_are(runner, tmp_path: Path) -> None:
    """A fingerprint starts with the model's name, its file's: brackets there are text, not rich markup (a "[/]"
    raised MarkupError, "[ft]" vanished from the table)."""
    names = ["m[/] q", "llama[ft] q"]
    for i, fingerprint in enumerate(names):
        with DiskStore(tmp_path, max_bytes=1 << 20, fingerprint=fingerprint) as store:
            assert store.put(h(i), [1, 2, 3, 4], bytes(256), META)
    result = runner.invoke(main, ["cache", "stats", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert all(name in result.output for name in names), result.output


def test_stats_json(runner, cache_dir: Path) -> None:
    result = runner.invoke(main, ["cache", "stats", str(cache_dir), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    sizes = sum(f.stat().st_size for f in page_files(cache_dir))
    assert out["directory"] == str(cache_dir) and out["pages"] == 4 and out["bytes"] == sizes
    assert {k: v["pages"] for k, v in out["fingerprints"].items()} == {FP: 3, "other-model": 1}
    assert sum(v["bytes"] for v in out["fingerprints"].values()) == sizes


def test_verify_a_clean_cache_exits_0(runner, cache_dir: Path) -> None:
    result = runner.invoke(main, ["cache", "verify", str(cache_dir)])
    assert result.exit_code == 0, result.output
    assert "checked 4 pages: 4 ok, 0 corrupt" in result.output


def _corrupt_one(cache_dir: Path) -> Path:
    victim = page_files(cache_dir)[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x10
    victim.write_bytes(bytes(data))
    return victim


def test_verify_finds_deletes_and_then_passes(runner, cache_dir: Path) -> None:
    victim = _corrupt_one(cache_dir)
    result = runner.invoke(main, ["cache", "verify", str(cache_dir)])
    assert result.exit_code == 1, result.output
    assert "3 ok, 1 corrupt, 1 removed" in result.output and str(victim) in result.output
    assert not victim.exists() and len(page_files(cache_dir)) == 3
    again = runner.invoke(main, ["cache", "verify", str(cache_dir)])
    assert again.exit_code == 0, again.output
    assert "checked 3 pages: 3 ok, 0 corrupt" in again.output


def test_verify_keep_reports_without_deleting(runner, cache_dir: Path) -> None:
    victim = _corrupt_one(cache_dir)
    result = runner.invoke(main, ["cache", "verify", str(cache_dir), "--keep"])
    assert result.exit_code == 1, result.output
    assert "1 corrupt" in result.output and victim.exists()


def test_clear_yes_deletes_every_page(runner, cache_dir: Path) -> None:
    result = runner.invoke(main, ["cache", "clear", str(cache_dir), "--yes"])
    assert result.exit_code == 0, result.output
    assert "removed 4 pages" in result.output
    assert page_files(cache_dir) == [] and (cache_dir / MARKER_NAME).exists()
    stats = runner.invoke(main, ["cache", "stats", str(cache_dir), "--json"])
    assert json.loads(stats.stdout)["pages"] == 0


def test_clear_asks_first(runner, cache_dir: Path) -> None:
    declined = runner.invoke(main, ["cache", "clear", str(cache_dir)], input="n\n")
    assert declined.exit_code != 0 and "Delete 4 pages" in declined.output
    assert len(page_files(cache_dir)) == 4
    accepted = runner.invoke(main, ["cache", "clear", str(cache_dir)], input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert page_files(cache_dir) == []


@pytest.mark.parametrize("command", ["clear", "stats", "verify"])
def test_a_directory_that_is_not_a_cache_is_refused(runner, tmp_path: Path, command: str) -> None:
    plain = tmp_path / "photos"
    plain.mkdir()
    (plain / "keep.kvpage").write_bytes(b"not a page")
    args = ["cache", command, str(plain)] + (["--yes"] if command == "clear" else [])
    line = _error_line(runner.invoke(main, args))
    assert str(plain) in line and "not a radixcache cache" in line
    assert (plain / "keep.kvpage").read_bytes() == b"not a page"
    assert sorted(p.name for p in plain.iterdir()) == ["keep.kvpage"]


@pytest.mark.parametrize("command", ["clear", "stats", "verify"])
def test_a_missing_directory_is_a_usage_error_naming_it(runner, tmp_path: Path, command: str) -> None:
    missing = tmp_path / "nowhere"
    result = runner.invoke(main, ["cache", command, str(missing)])
    line = _error_line(result)
    assert result.exit_code == 2
    assert str(missing) in line and "does not exist" in line
    assert not missing.exists()


def test_the_cache_commands_do_not_load_torch(cache_dir: Path) -> None:
    code = (
        "import sys\n"
        "from radixcache.cli.main import main\n"
        "try:\n"
        "    main(['cache', 'verify', sys.argv[1]])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "assert 'radixcache.runtime.kv.tier.disk_store' in sys.modules\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(cache_dir)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "4 ok" in done.stdout


@pytest.mark.parametrize("command", ["stats", "verify", "clear"])
def test_a_quoted_tilde_is_the_home_folder_as_the_engine_takes_it(
    runner, cache_dir: Path, monkeypatch, command: str
) -> None:
    """'~/kv-cache' (quoted, or from a script: no shell expands it) is the directory the engine's --cache-dir names
    (kv.tier.disk_layout.cache_path), not a missing one."""
    monkeypatch.setenv("HOME", str(cache_dir.parent))
    args = ["cache", command, "~/kv-cache"] + (["--yes"] if command == "clear" else [])
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert str(cache_dir) in result.output or "4 ok" in result.output
    assert (page_files(cache_dir) == []) == (command == "clear")


@pytest.mark.parametrize("command", ["stats", "verify", "clear"])
def test_an_empty_dir_is_refused_not_the_working_directory(runner, cache_dir: Path, monkeypatch, command: str) -> None:
    """`radixcache cache clear "$CACHE" --yes` with CACHE unset, run from a cache directory, cleared it: "" was the
    working directory."""
    monkeypatch.chdir(cache_dir)
    result = runner.invoke(main, ["cache", command, ""] + (["--yes"] if command == "clear" else []))
    assert result.exit_code == 2 and "empty" in _error_line(result)
    assert len(page_files(cache_dir)) == 4
