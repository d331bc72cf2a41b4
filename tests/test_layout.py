"""The import graph of the three source folders (radixcache/, runtime/ as radixcache.runtime, cli/ as radixcache.cli).

These tests read every module with `ast` (nothing is imported) and check that the modules form no import cycle,
TYPE_CHECKING imports included (one deferred import of the invariant checker excepted, below), that the library's
packages and the runtime's sub-packages form none either, and that every layer depends only downwards: the library
on neither the runtime, the CLI nor torch; inside the library, each package only on the floors it names in
`LIBRARY_MAY_IMPORT`; the simulator (radixcache.sim) imported by nobody but the CLI and itself. The packaging is
checked in tests/test_packaging.py, module sizes in tests/test_module_sizes.py.
"""

from __future__ import annotations

import ast
import itertools
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


def _format(
    found: list[list[str]], part: Callable[[str], str | None] = lambda name: name, *, type_checking: bool = False
) -> str:
    """Each cycle as a path, then the imports that make each of its steps (`part` maps a module to its node;
    `type_checking`: TYPE_CHECKING imports count as steps too)."""
    lines = []
    for cycle in found:
        lines.append(" -> ".join(cycle))
        for a, b in itertools.pairwise(cycle):
            steps = (
                f"    {imp}"
                for imp in imports()
                if (type_checking or not imp.type_checking)
                and imp.target in modules()
                and not _excepted(imp)
                and (part(imp.source), part(imp.target)) == (a, b)
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


def _part_graph(graph: dict[str, set[str]], part: Callable[[str], str | None]) -> dict[str, set[str]]:
    """The module graph folded onto parts (`part` maps a module to its part, None to leave it out)."""
    folded: dict[str, set[str]] = {}
    for source, targets in graph.items():
        a = part(source)
        if a is None:
            continue
        folded.setdefault(a, set())
        folded[a] |= {b for b in map(part, targets) if b is not None and b != a}
    return folded


def test_the_runtime_subpackages_depend_on_each_other_without_a_cycle() -> None:
    runtime = FOLDERS[RUNTIME]
    subpackages = {d.name for d in runtime.iterdir() if (d / "__init__.py").is_file()}
    assert {"engine", "kv", "model", "loading", "native", "server", "replay"} <= subpackages
    # The runtime package's __init__ exposes Engine, SamplingParams, ... lazily: a module __getattr__ calls
    # importlib.import_module on first access, and the imports it names statically sit under TYPE_CHECKING. Neither
    # is an edge here, so `__init__` does not depend on engine: were those lazy exposures counted, every
    # sub-package that imports from `radixcache.runtime` would seem to sit in a cycle with engine (engine ->
    # config is fine; x -> __init__ -> engine -> x would be false), while nothing runs at import time.
    graph = _part_graph(edges(), _runtime_part)
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


# ---------------------------------------------------------------------------------------------- type-checking imports

INVARIANTS = f"{LIBRARY}.invariants"


def _excepted(imp: Import) -> bool:
    """The one loop the layout allows: the tree calls its invariant checker through an import inside the method
    (`check_invariants`), and the checker names the tree's types under TYPE_CHECKING. The checker is a debugging
    aid that reads the whole tree; importing it at module level would load it on every `import radixcache`."""
    return imp.deferred and imp.target == INVARIANTS and _within(imp.source, LIBRARY) and not imp.type_checking


def _full_edges() -> dict[str, set[str]]:
    """The graph with TYPE_CHECKING imports, less the excepted deferred import of the invariant checker."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for imp in imports():
        if imp.target in known and imp.target != imp.source and not _excepted(imp):
            graph[imp.source].add(imp.target)
    return graph


def test_no_cycle_among_modules_even_counting_type_checking_imports() -> None:
    found = cycles(_full_edges())
    assert not found, "import cycles among modules (TYPE_CHECKING imports counted):\n" + _format(
        found, type_checking=True
    )


def test_the_excepted_invariant_import_is_deferred_and_the_only_one() -> None:
    excepted = [imp for imp in imports() if _excepted(imp)]
    assert excepted, "the invariant checker is no longer imported lazily: drop the exception"
    assert not [
        str(imp) for imp in imports() if imp.target == INVARIANTS and not imp.deferred and not imp.type_checking
    ], "the invariant checker must be imported inside the function that runs it"


def _library_part(name: str) -> str | None:
    """The library package a module belongs to ("policy", "sim", ...), "ground" for a top-level module of
    radixcache/ (cache, node, blocks, ...), None for the package's own __init__ (the facade) and outside it."""
    if name == LIBRARY or not _within(name, LIBRARY) or _within(name, RUNTIME) or _within(name, CLI):
        return None
    rest = name[len(LIBRARY) + 1 :]
    head, dot, _ = rest.partition(".")
    return head if dot or modules()[name].is_package else "ground"


#: what each floor of the library may import besides itself. The ground floor (the tree and its contract) uses the
#: eviction policies it is given (policy/ knows TreeNode only to type it); tiers extend the tree; trace readers and
#: the router's index stand on the ground floor alone; the simulator uses all of them and nothing uses it.
LIBRARY_MAY_IMPORT: dict[str, set[str]] = {
    "ground": {"policy"},
    "policy": {"ground"},
    "tier": {"ground", "policy"},
    "trace": {"ground"},
    "router": {"ground"},
    "data": set(),
    "sim": {"ground", "policy", "tier", "trace", "router"},
}


def test_each_library_package_imports_only_the_floors_below_it() -> None:
    parts = {_library_part(name) for name in modules()} - {None}
    assert parts == set(LIBRARY_MAY_IMPORT), f"a library package without a rule, or a rule without a package: {parts}"
    bad = []
    for imp in imports():
        a, b = _library_part(imp.source), _library_part(imp.target)
        if a is None or b is None or a == b or _excepted(imp):
            continue
        if b not in LIBRARY_MAY_IMPORT[a]:
            bad.append(f"{imp} ({a} may import only {sorted(LIBRARY_MAY_IMPORT[a])})")
    assert not bad, "upward imports inside the library:\n" + "\n".join(bad)


def _library_unit(name: str) -> str | None:
    """A library package, or a top-level module of radixcache/ on its own: the units that may not form a loop
    (the ground floor's modules are separate units, so the tree using policy/ and policy/ typing TreeNode is no
    loop, while policy/ importing the tree back would be)."""
    part = _library_part(name)
    return name if part == "ground" else part


def test_the_library_packages_and_ground_modules_form_no_cycle_even_counting_type_checking_imports() -> None:
    found = cycles(_part_graph(_full_edges(), _library_unit))
    assert not found, "cycles among the library's packages and ground modules:\n" + _format(
        found, _library_unit, type_checking=True
    )


def test_the_runtime_subpackages_form_no_cycle_even_counting_type_checking_imports() -> None:
    found = cycles(_part_graph(_full_edges(), _runtime_part))
    assert not found, "cycles among the runtime's sub-packages (TYPE_CHECKING imports counted):\n" + _format(
        found, _runtime_part, type_checking=True
    )


def test_the_simulator_is_imported_by_nobody_but_itself_and_the_cli() -> None:
    sim = f"{LIBRARY}.sim"
    bad = [
        str(imp)
        for imp in imports()
        if _within(imp.target, sim) and not _within(imp.source, sim) and not _within(imp.source, CLI)
    ]
    assert not bad, "radixcache.sim is a user of the core, like the runtime; nothing below it may import it:\n" + (
        "\n".join(bad)
    )


def test_nobody_imports_the_old_paths_or_the_finder_that_serves_them() -> None:
    finders = {f"{LIBRARY}.moved", f"{RUNTIME}.moved"}
    bad = [str(imp) for imp in imports() if imp.target in finders and imp.source not in (LIBRARY, RUNTIME)]
    assert not bad, "only the two packages' __init__ install their old paths:\n" + "\n".join(bad)
