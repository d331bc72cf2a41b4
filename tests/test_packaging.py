"""The packaging of the three source folders.

radixcache/, runtime/ and cli/ stay at the repository root but install under one name (pyproject.toml's
[tool.setuptools.package-dir]): runtime/ as radixcache.runtime, cli/ as radixcache.cli. These tests check that the
packaging names every package folder and installs no top-level `runtime` or `cli`.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 has no tomllib
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parent.parent
# source folder -> the package name it installs as
FOLDERS = {"radixcache": REPO / "radixcache", "radixcache.runtime": REPO / "runtime", "radixcache.cli": REPO / "cli"}
RUNTIME, CLI = "radixcache.runtime", "radixcache.cli"


def _folder_package(folder: Path, name: str, directory: Path) -> str:
    rel = directory.relative_to(folder)
    return ".".join((name, *rel.parts))


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


def test_a_missing_runtime_name_is_an_attribute_error_naming_the_installed_package() -> None:
    import radixcache.runtime

    with pytest.raises(AttributeError, match=r"^module 'radixcache\.runtime' has no attribute 'Engin'$"):
        radixcache.runtime.Engin  # noqa: B018 - the lazy __getattr__ named a 'runtime' module that is not installed
    assert not hasattr(radixcache.runtime, "Engin")
    assert radixcache.runtime.Engine.__module__ == "radixcache.runtime.engine.engine"
