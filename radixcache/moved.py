"""The import paths of the layout before the sub-packages (policy/, tier/, trace/, sim/), kept working.

`import radixcache` installs one finder on `sys.meta_path` that answers only for the names in `MOVED`: importing
`radixcache.simulate` (say) gives a module holding every public name of its new homes, with a
DeprecationWarning that names them. Nothing in this project imports an old path (tests/test_layout.py checks),
so the finder costs nothing until a user's old code asks. The new modules load only then, which keeps the core
free of any import of the simulator.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Mapping
from types import ModuleType

#: old module -> its new homes, searched in order for each name
MOVED: dict[str, tuple[str, ...]] = {
    "radixcache.admission": ("radixcache.policy.admission",),
    "radixcache.policies": (
        "radixcache.policy.classic",
        "radixcache.policy.registry",
        "radixcache.policy.base",
        "radixcache.sim.belady",
    ),
    "radixcache.policy_base": ("radixcache.policy.base",),
    "radixcache.reuse_policy": ("radixcache.policy.reuse",),
    "radixcache.tiers": ("radixcache.tier.page_tier",),
    "radixcache.tiered": ("radixcache.tier.tiered_cache",),
    "radixcache.records": ("radixcache.trace.records",),
    "radixcache.synthetic": ("radixcache.trace.synthetic",),
    "radixcache.simulate_workload": ("radixcache.trace.workload",),
    "radixcache.trace.replay_log": ("radixcache.trace.replay_output", "radixcache.stats"),
    "radixcache.simulate": (
        "radixcache.sim.simulation",
        "radixcache.sim.evaluation",
        "radixcache.sim.results",
        "radixcache.sim.cache_replay",
        "radixcache.sim.tiered_replay",
        "radixcache.sim.infinite_replay",
        "radixcache.sim.replay_common",
    ),
    "radixcache.simulate_routing": (
        "radixcache.sim.routing_replay",
        "radixcache.sim.routing_results",
        "radixcache.sim.routing_workload",
        "radixcache.sim.routing_cells",
    ),
    **{
        f"radixcache.simulate_{name}": (f"radixcache.sim.{name}",)
        for name in (
            "compare",
            "flat",
            "flat_lru",
            "fork",
            "infinite_ids",
            "inflight",
            "oracle",
            "packing",
            "prefixes",
            "read_ahead",
            "source",
            "sweep",
            "tiers",
        )
    },
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the old paths of one map (old module -> its new homes) as modules that gather their new
    homes' names."""

    def __init__(self, moved: Mapping[str, tuple[str, ...]] = MOVED) -> None:
        self.moved = moved

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec:
        if fullname not in self.moved:
            return None  # type: ignore[return-value]
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        homes = self.moved[module.__name__]
        warnings.warn(
            f"{module.__name__} moved to {' and '.join(homes)}; import from there", DeprecationWarning, stacklevel=2
        )
        for home in reversed(homes):  # the first home wins a name that two define
            source = importlib.import_module(home)
            module.__dict__.update({k: v for k, v in vars(source).items() if not k.startswith("__")})
        module.__doc__ = f"Deprecated alias of {', '.join(homes)}."


def install(moved: Mapping[str, tuple[str, ...]] = MOVED) -> None:
    """Put a finder for `moved` on `sys.meta_path`, once per interpreter and map (importlib.reload is safe).

    The runtime installs its own map (radixcache.runtime.moved) the same way, so this module names no path above
    the library."""
    if not any(isinstance(finder, MovedModuleFinder) and finder.moved is moved for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder(moved))
