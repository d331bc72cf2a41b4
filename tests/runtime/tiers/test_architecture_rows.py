"""docs/architecture.md and docs/tiers.md name every module of runtime/kv/tier/ (host_recency.py was missing from
the first's table, eight modules from the second's)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


MODULES = sorted(p.name for p in (REPO / "runtime" / "kv" / "tier").glob("*.py") if p.name != "__init__.py")


def test_every_tier_module_has_a_row_in_the_architecture() -> None:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert MODULES
    assert [m for m in MODULES if f"`kv/tier/{m}`" not in text] == []


def test_every_tier_module_is_in_the_tiers_guide_where_the_code_lives() -> None:
    text = (REPO / "docs" / "tiers.md").read_text(encoding="utf-8")
    table = text[text.index("## Where the code lives") :].split("\n## ", 1)[0]
    assert [m for m in MODULES if f"`runtime/kv/tier/{m}`" not in table and f"`{m}`" not in table] == []
