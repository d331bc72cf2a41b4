"""`import radixcache` stays pure Python: it must not pull in torch (or numpy), so simulations start at once."""

from __future__ import annotations

import json
import subprocess
import sys


def modules_after_import(statement: str) -> set[str]:
    """Run `statement` in a fresh interpreter and return the names in its sys.modules afterwards."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def test_importing_radixcache_does_not_import_torch() -> None:
    loaded = modules_after_import("import radixcache")
    assert "radixcache" in loaded
    assert not {name for name in loaded if name == "torch" or name.startswith("torch.")}


def test_using_the_cache_does_not_import_torch_or_numpy() -> None:
    # numpy is only a runtime extra (pyproject.toml): a core install has no numpy to import
    loaded = modules_after_import(
        "from radixcache import RadixCache\n"
        "c = RadixCache(8, policy='cost')\n"
        "c.insert([1, 2, 3], c.allocate(3))\n"
        "c.match_prefix([1, 2])\n"
        "c.evict(8)\n"
        "c.check_invariants()"
    )
    assert "torch" not in loaded
    assert "numpy" not in loaded
