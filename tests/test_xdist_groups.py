"""Tests marked with an xdist group run on one worker under `--dist loadgroup` (what .ci/run uses).

pytest-xdist groups a test by tagging its node id with `@group` on the worker; a pytest that stops honouring that
tag (9.2 did, with pytest-xdist 3.8) splits every group silently, and two Ray clusters or two copies of a
module's SmolLM2 fixture then run at once on the machine's two cores. This test fails instead.

A test marked with two groups (its module's and its own) is in neither: pytest-xdist joins the names into a group
of its own. test_no_test_carries_two_xdist_groups reads every test module for that.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.xdist_group("probe")
def test_a_grouped_test_carries_its_group_in_its_node_id_under_loadgroup(request: pytest.FixtureRequest) -> None:
    config = request.config
    if not hasattr(config, "workerinput") or not getattr(config.option, "loadgroup", False):
        pytest.skip("not a pytest-xdist worker under --dist loadgroup: nothing groups here")
    assert request.node.nodeid.endswith("@probe"), f"the group tag is missing: {request.node.nodeid}"


def _group_marks(node: ast.AST, aliases: set[str]) -> int:
    """How many xdist_group marks the expression `node` holds: calls of `*.xdist_group(...)`, or names bound to one."""
    return sum(
        (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "xdist_group")
        or (isinstance(sub, ast.Name) and sub.id in aliases)
        for sub in ast.walk(node)
    )


def two_group_tests(source: str) -> list[str]:
    """The tests and classes of a module's `source` that an xdist_group mark of the module (its `pytestmark`) and one
    of their own both reach."""
    tree = ast.parse(source)
    aliases = {
        target.id
        for stmt in tree.body
        if isinstance(stmt, ast.Assign) and _group_marks(stmt.value, set())
        for target in stmt.targets
        if isinstance(target, ast.Name) and target.id != "pytestmark"
    }
    module_marked = any(
        isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets)
        and _group_marks(stmt.value, aliases)
        for stmt in tree.body
    )
    if not module_marked:
        return []
    own = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [
        stmt.name
        for stmt in tree.body
        if isinstance(stmt, own) and any(_group_marks(d, aliases) for d in stmt.decorator_list)
    ]


def test_no_test_carries_two_xdist_groups() -> None:
    """pytest-xdist joins every xdist_group a test is marked with into one name (its remote plugin): a test marked
    "ray" in a module marked "structured_smollm2" ran in a group "ray_structured_smollm2" of its own, its Ray cluster
    beside the "ray" group's on the other worker. Each test gets its group from one place."""
    found = {
        str(path.relative_to(TESTS)): names
        for path in sorted(TESTS.rglob("*.py"))
        if (names := two_group_tests(path.read_text(encoding="utf-8")))
    }
    assert not found, found


def test_the_two_group_check_finds_a_mark_beside_the_modules_and_nothing_else() -> None:
    both = 'import pytest\npytestmark = [pytest.mark.slow, pytest.mark.xdist_group("a")]\n\n'
    both += '@pytest.mark.xdist_group("b")\ndef test_x():\n    pass\n\ndef test_y():\n    pass\n'
    assert two_group_tests(both) == ["test_x"]
    alias = 'import pytest\nalone = pytest.mark.xdist_group("b")\npytestmark = pytest.mark.xdist_group("a")\n\n'
    alias += "@alone\nclass TestX:\n    pass\n"
    assert two_group_tests(alias) == ["TestX"]
    apart = 'import pytest\npytestmark = pytest.mark.slow\n\n@pytest.mark.xdist_group("b")\ndef test_x():\n    pass\n'
    assert two_group_tests(apart) == []
