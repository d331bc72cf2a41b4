"""docs/architecture.md's `cluster/` row names every module of runtime/cluster (calls.py, the front door's tool calls,
was missing)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_cluster_row_names_every_module() -> None:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    (row,) = [line for line in text.splitlines() if line.startswith("| `cluster/` |")]
    modules = sorted(p.name for p in (REPO / "runtime" / "cluster").glob("*.py") if p.name != "__init__.py")
    assert [m for m in modules if f"`{m}`" not in row] == []
