"""The import graph and the packaging of the three source folders.

radixcache/, runtime/ and cli/ stay at the repository root but install under one name (pyproject.toml's
[tool.setuptools.package-dir]): runtime/ as radixcache.runtime, cli/ as radixcache.cli. These tests read every
module with `ast` (nothing is imported) and check that the modules form no import cycle, that the layers depend
only downwards (the pure library on neither the runtime, the CLI nor torch), and that the packaging names every
package folder and installs no top-level `runtime` or `cli`.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 has no tomllib
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parent.parent
# source folder -> the package name it installs as
FOLDERS = {"radixcache": REPO / "radixcache", "radixcache.runtime": REPO / "runtime", "radixcache.cli": REPO / "cli"}
LIBRARY, RUNTIME, CLI = "radixcache", "radixcache.runtime", "radixcache.cli"


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool  # an __init__.py: relative imports resolve from the module itself


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module: a project module, or the top-level name of anything else ("torch")
    line: int
    type_checking: bool  # inside an `if TYPE_CHECKING:` block
    deferred: bool  # inside a function: runs when called, not when the module loads
    name: str | None = None  # the name taken, for `from X import name` when X.name is not a module

    def __str__(self) -> str:
        where = f"{self.source} (line {self.line}{', in a function' if self.deferred else ''})"
        return f"{where} imports {self.target}" + (" under TYPE_CHECKING" if self.type_checking else "")


def _folder_package(folder: Path, name: str, directory: Path) -> str:
    rel = directory.relative_to(folder)
    return ".".join((name, *rel.parts))


@cache
def modules() -> dict[str, Module]:
    """Every .py module of the three folders, by its installed name."""
    found: dict[str, Module] = {}
    for name, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            package = _folder_package(folder, name, path.parent)
            if path.name == "__init__.py":
                found[package] = Module(package, path, True)
            else:
                found[f"{package}.{path.stem}"] = Module(f"{package}.{path.stem}", path, False)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


_Found = tuple[ast.Import | ast.ImportFrom, bool, bool]


def _walk(nodes: Iterable[ast.AST], type_checking: bool, deferred: bool) -> Iterator[_Found]:
    """Every import statement, anywhere (functions, classes, try blocks), with whether TYPE_CHECKING guards it
    and whether it sits in a function."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, type_checking, deferred
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _walk(node.body, True, deferred)
            yield from _walk(node.orelse, type_checking, deferred)
        else:
            inner = deferred or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _walk(ast.iter_child_nodes(node), type_checking, inner)


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module name a `from ... import` reads from."""
    if not node.level:
        return node.module or ""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    parts = package.split(".")
    base = parts[: len(parts) - (node.level - 1)]
    assert len(base) == len(parts) - (node.level - 1) and base, f"{module.name}: relative import beyond the top"
    return ".".join([*base, *([node.module] if node.module else [])])


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _project(name: str) -> bool:
    return _within(name, LIBRARY)


@cache
def imports() -> tuple[Import, ...]:
    """Every import of every module, resolved: a project target is the module imported (`from X import Y` is
    an import of X.Y when that is a module, else of X; a package is its __init__); any other target is its
    top-level name. Each statement and each name gives one Import."""
    known = modules()
    found: list[Import] = []
    for module in known.values():
        tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
        for node, type_checking, deferred in _walk(tree.body, False, False):
            targets: list[tuple[str, str | None]] = []
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            else:
                base = _resolve(module, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append((sub, None) if sub in known else (base, alias.name))
            for target, name in targets:
                if not _project(target):
                    target = target.partition(".")[0]
                found.append(Import(module.name, target, node.lineno, type_checking, deferred, name))
    return tuple(found)


def edges(*, type_checking: bool = False) -> dict[str, set[str]]:
    """The project import graph: module -> the project modules it imports (TYPE_CHECKING imports only if asked)."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for imp in imports():
        if imp.target in known and imp.target != imp.source and (type_checking or not imp.type_checking):
            graph[imp.source].add(imp.target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path back to its start) per strongly connected component that has one (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_cycle_in(graph, set(component)) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first member (breadth first within the component)."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in parents:
                    parents[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle in the component {sorted(component)}")


def _format(found: list[list[str]], part: Callable[[str], str | None] = lambda name: name) -> str:
    """Each cycle as a path, then the imports that make each of its steps (`part` maps a module to its node)."""
    lines = []
    for cycle in found:
        lines.append(" -> ".join(cycle))
        for a, b in itertools.pairwise(cycle):
            steps = (
                f"    {imp}"
                for imp in imports()
                if not imp.type_checking and imp.target in modules() and (part(imp.source), part(imp.target)) == (a, b)
            )
            lines.extend(dict.fromkeys(steps))  # one line per statement, however many names it imports
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- the graph


def test_the_parser_finds_every_folder_and_the_imports_it_should() -> None:
    names = modules()
    assert {LIBRARY, RUNTIME, CLI, f"{LIBRARY}.cache", f"{RUNTIME}.kv.retention"} <= set(names)
    assert f"{LIBRARY}.cache" in edges()[LIBRARY]  # from radixcache.cache import ... in radixcache/__init__.py
    # radixcache/policy/classic.py imports TreeNode only under TYPE_CHECKING
    assert f"{LIBRARY}.node" not in edges()[f"{LIBRARY}.policy.classic"]
    assert f"{LIBRARY}.node" in edges(type_checking=True)[f"{LIBRARY}.policy.classic"]


def test_the_cycle_finder_reports_each_cycle_as_a_path_back_to_its_start() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"g"}, "g": {"f"}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["e", "e"], ["f", "g", "f"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_project_imports_name_modules_that_exist() -> None:
    known = modules()
    broken = [str(imp) for imp in imports() if _project(imp.target) and imp.target not in known]
    assert not broken, "imports of project modules that do not exist:\n" + "\n".join(broken)


def test_no_module_imports_itself_back_through_a_cycle() -> None:
    found = cycles(edges())
    assert not found, "import cycles among modules (TYPE_CHECKING imports ignored):\n" + _format(found)


def _runtime_part(name: str) -> str | None:
    """The runtime sub-package a module belongs to, a top-level runtime module's own name ("config"; the package
    itself is "__init__"), or None outside the runtime."""
    if name == RUNTIME:
        return "__init__"
    if not _within(name, RUNTIME):
        return None
    return name[len(RUNTIME) + 1 :].partition(".")[0]


def test_the_runtime_subpackages_depend_on_each_other_without_a_cycle() -> None:
    runtime = FOLDERS[RUNTIME]
    subpackages = {d.name for d in runtime.iterdir() if (d / "__init__.py").is_file()}
    assert {"engine", "kv", "model", "loading", "native", "server", "replay"} <= subpackages
    # The runtime package's __init__ exposes Engine, SamplingParams, ... lazily: a module __getattr__ calls
    # importlib.import_module on first access, and the imports it names statically sit under TYPE_CHECKING. Neither
    # is an edge here, so `__init__` does not depend on engine: were those lazy exposures counted, every
    # sub-package that imports from `radixcache.runtime` would seem to sit in a cycle with engine (engine ->
    # config is fine; x -> __init__ -> engine -> x would be false), while nothing runs at import time.
    graph: dict[str, set[str]] = {}
    for source, targets in edges().items():
        a = _runtime_part(source)
        if a is None:
            continue
        graph.setdefault(a, set())
        for target in targets:
            b = _runtime_part(target)
            if b is not None and b != a:
                graph[a].add(b)
    found = cycles(graph)
    assert not found, "cycles among the runtime's sub-packages (TYPE_CHECKING imports ignored):\n" + _format(
        found, _runtime_part
    )


# ---------------------------------------------------------------------------------------------- layering


def test_the_library_imports_neither_the_runtime_nor_the_cli_nor_torch() -> None:
    bad = [
        str(imp)
        for imp in imports()
        if not imp.type_checking
        and not _within(imp.source, RUNTIME)
        and not _within(imp.source, CLI)
        and (imp.target == "torch" or _within(imp.target, RUNTIME) or _within(imp.target, CLI))
    ]
    assert not bad, "the pure library (radixcache/) must not import these:\n" + "\n".join(bad)


def test_the_runtime_does_not_import_the_cli() -> None:
    bad = [
        str(imp)
        for imp in imports()
        if not imp.type_checking and _within(imp.source, RUNTIME) and _within(imp.target, CLI)
    ]
    assert not bad, "the runtime (runtime/) must not import the CLI:\n" + "\n".join(bad)


def _lazy_exports(package: str) -> dict[str, str]:
    """A package's `_LAZY = {name: module}`: the names its module __getattr__ imports on first access."""
    tree = ast.parse(modules()[package].path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets) and node.value is not None:
                return ast.literal_eval(node.value)
    return {}


def test_the_scheduler_does_not_import_the_engine_even_for_type_checking() -> None:
    scheduler, engine = f"{RUNTIME}.engine.scheduler", f"{RUNTIME}.engine.engine"
    assert scheduler in modules()
    lazy = _lazy_exports(RUNTIME)
    assert lazy.get("Engine") == engine  # `from radixcache.runtime import Engine` is an import of the engine too
    bad = [
        str(imp) + (f" (its {imp.name})" if imp.name else "")
        for imp in imports()
        if imp.source == scheduler
        and (imp.target == engine or (imp.target == RUNTIME and lazy.get(imp.name) == engine))
    ]
    assert not bad, "the scheduler must not depend on the Engine that drives it:\n" + "\n".join(bad)


# ---------------------------------------------------------------------------------------------- packaging


def _pyproject() -> dict:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_the_packages_listed_in_pyproject_are_the_folders_with_an_init() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]
    folders = {
        _folder_package(folder, name, init.parent)
        for name, folder in FOLDERS.items()
        for init in folder.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    listed = set(setuptools["packages"])
    assert listed == folders, (
        f"listed but no such package folder: {sorted(listed - folders)}; "
        f"package folders not listed: {sorted(folders - listed)}"
    )
    assert len(setuptools["packages"]) == len(listed), "a package is listed twice"
    # A folder of modules without an __init__.py would not be installed at all.
    loose = sorted(
        str(path.parent.relative_to(REPO))
        for folder in FOLDERS.values()
        for path in folder.rglob("*.py")
        if "__pycache__" not in path.parts and not (path.parent / "__init__.py").is_file()
    )
    assert not loose, f"folders with modules but no __init__.py: {sorted(set(loose))}"


def test_pyproject_maps_the_runtime_and_cli_folders_under_radixcache() -> None:
    package_dir = _pyproject()["tool"]["setuptools"]["package-dir"]
    assert package_dir.get(RUNTIME) == "runtime"
    assert package_dir.get(CLI) == "cli"


def test_the_installed_names_resolve_into_the_repository_and_claim_no_top_level_runtime_or_cli(tmp_path: Path) -> None:
    spec = importlib.util.find_spec(RUNTIME)
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).resolve() == REPO / "runtime" / "__init__.py"
    # What the installed distribution provides, seen from a fresh interpreter outside the repository: -I leaves
    # the current directory and PYTHONPATH off sys.path, either of which could show this checkout's runtime/
    # folder as a top-level package that no install provides.
    probe = (
        "import importlib.util, json\n"
        "out = {}\n"
        "for name in ('radixcache', 'radixcache.runtime', 'radixcache.cli', 'runtime', 'cli'):\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    out[name] = None if spec is None else (spec.origin, list(spec.submodule_search_locations or []))\n"
        "print(json.dumps(out))\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60
    )
    found = json.loads(result.stdout)
    for name, folder in FOLDERS.items():
        assert found[name] is not None, f"{name} is not importable from the installed distribution"
        origin, locations = found[name]
        assert Path(origin).resolve() == folder / "__init__.py", f"{name} resolves to {origin}, not {folder}"
    for name in ("runtime", "cli"):
        spec_found = found[name]
        if spec_found is not None:
            origin, locations = spec_found
            paths = [Path(p).resolve() for p in [*(locations or []), *([origin] if origin else [])]]
            assert not any(p == REPO or REPO in p.parents for p in paths), (
                f"a top-level {name!r} package resolves into this repository: {spec_found}"
            )
