"""Every module of radixcache/, runtime/, cli/, scripts/ and tests/ is small enough to read in one sitting.

The rule of the house: under about 400 lines (`LIMIT` allows a little over, so a docstring's growth does not
force a split). A module that is one idea and would be worse split may be longer only if docs/architecture.md
names it, with its reason, in the section headed `SECTION`; a module named there must really be over the limit,
so the list stays true.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("radixcache", "runtime", "cli", "scripts", "tests")
LIMIT = 420
SECTION = "## Modules over 400 lines"


def _sizes() -> dict[str, int]:
    return {
        str(path.relative_to(REPO)): len(path.read_text(encoding="utf-8").splitlines())
        for folder in FOLDERS
        for path in sorted((REPO / folder).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _justified() -> set[str]:
    """The paths that docs/architecture.md's section names, each as a `path/like/this.py` in backticks."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    start = text.find(SECTION)
    if start < 0:
        return set()
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end >= 0 else len(text)]
    return set(re.findall(r"`([\w/]+\.py)`", section))


def test_no_module_is_over_the_limit_unless_the_architecture_names_it() -> None:
    too_long = {path: n for path, n in _sizes().items() if n > LIMIT and path not in _justified()}
    assert not too_long, f"modules over {LIMIT} lines not justified in docs/architecture.md: {too_long}"


def test_every_module_the_architecture_justifies_exists_and_is_long() -> None:
    sizes = _sizes()
    stale = {path: sizes.get(path) for path in _justified() if sizes.get(path, 0) <= 400}
    assert not stale, f"docs/architecture.md justifies modules that are missing or no longer long: {stale}"
