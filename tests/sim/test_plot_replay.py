"""scripts/plot_replay.py: the plot of a `radixcache replay --json` file, and an --out it cannot write refused in one
line before the plot is drawn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.sim.conftest import load_script

RECORD = {"conversation": "a", "turn": 0, "prompt_tokens": 10, "cached_tokens": 5, "prefill_tokens": 5}
RECORD |= {"output_tokens": 3, "ttft_s": 0.1, "latency_s": 0.5}


def replay_json(tmp_path: Path) -> str:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"summary": {"label": "cache", "model": "m"}, "requests": [RECORD, RECORD]}))
    return str(path)


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("missing/r.png", "the folder {tmp}/missing does not exist"),
        ("r.xyz", "matplotlib writes no 'xyz' images; give a suffix of"),
    ],
)
def test_an_out_it_cannot_write_is_one_line(
    tmp_path: Path, out: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: a folder that does not exist was a FileNotFoundError traceback, and a suffix matplotlib has no
    writer for a ValueError one, each after the plot was drawn."""
    code = load_script("plot_replay").main([replay_json(tmp_path), "--out", str(tmp_path / out)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"error: --out {tmp_path / out}: {message.format(tmp=tmp_path)}"), err
    assert "Traceback" not in err and err.count("\n") == 1


def test_a_plot_cut_while_writing_leaves_the_earlier_one_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: the image was written in place, so a plot stopped while writing (Ctrl-C, a full disk) left the
    earlier one cut short. It is written whole now (radixcache.runtime.atomic_file), and a write error is one line."""
    import matplotlib.figure

    main, out = load_script("plot_replay").main, tmp_path / "r.png"
    assert main([replay_json(tmp_path), "--out", str(out)]) == 0
    earlier = out.read_bytes()
    assert earlier.startswith(b"\x89PNG")

    def savefig(self: object, where: str, *args: object, **kwargs: object) -> None:
        Path(where).write_bytes(b"\x89PNG cut short")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    capsys.readouterr()
    assert main([replay_json(tmp_path), "--out", str(out)]) == 1
    assert capsys.readouterr().err == f"error: {out}: No space left on device\n"
    assert out.read_bytes() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.png"]
