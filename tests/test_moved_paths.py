"""The import paths of the layout before the sub-packages still work (radixcache.moved, and the runtime's own map
in radixcache.runtime.moved), and warn.

tests/old_public_names.json lists every public top-level name each old module defined (or listed in `__all__`) at
the last commit of the old layout, read from its source with `ast` (module loggers left out): an independent
record, not the code under test.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

from radixcache.moved import MOVED, MovedModuleFinder
from radixcache.runtime.moved import RUNTIME_MOVED

OLD_NAMES: dict[str, list[str]] = json.loads((Path(__file__).parent / "old_public_names.json").read_text())
ALL_MOVED = {**MOVED, **RUNTIME_MOVED}


def _import_fresh(name: str) -> ModuleType:
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def test_every_moved_path_is_recorded_and_every_record_is_moved() -> None:
    assert set(OLD_NAMES) == set(ALL_MOVED)
    import radixcache.runtime  # noqa: F401 - installs the runtime's map


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_an_old_path_imports_with_a_deprecation_warning_naming_its_new_home(old: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to .*{ALL_MOVED[old][0]}"):
        _import_fresh(old)


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_an_old_path_still_offers_every_public_name_it_had_as_the_same_object(old: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = _import_fresh(old)
    missing = [name for name in OLD_NAMES[old] if not hasattr(module, name)]
    assert not missing, f"{old} lost {missing}"
    for name in OLD_NAMES[old]:
        homes = [importlib.import_module(home) for home in ALL_MOVED[old]]
        owners = [home for home in homes if name in vars(home)]
        assert getattr(module, name) is getattr(owners[0], name), f"{old}.{name} is not {owners[0].__name__}.{name}"


def test_the_documented_old_imports_run() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from radixcache.admission import AdmissionPolicy, AdmissionRequest  # noqa: F401
        from radixcache.policies import BeladyPolicy, make_policy  # noqa: F401
        from radixcache.simulate import evaluate, simulate  # noqa: F401
        from radixcache.trace.replay_log import percentile, read_replay_json, replay_stats  # noqa: F401
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0


def test_a_name_that_was_never_moved_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("radixcache.simulate_nothing_like_this")
    assert MovedModuleFinder().find_spec("radixcache.cache") is None


def test_importing_the_core_loads_neither_the_simulator_nor_torch_nor_any_old_path() -> None:
    probe = (
        "import sys, radixcache\n"
        "bad = sorted(m for m in sys.modules if m.startswith('radixcache.sim') or m == 'torch' "
        "or m.startswith('radixcache.runtime'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""
