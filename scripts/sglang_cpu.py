"""SGLang's RadixCache on CPU, without its server: the reference tree scripts/bench_tree.py compares ours against.

SGLang is optional and never part of this project: its wheel is installed outside the repository (see
bench_tree.py). `load_sglang` imports its radix_cache module from there with the GPU and server imports it does not
need on this path replaced by inert placeholders, and `CpuSlotAllocator` gives it a small CPU allocator of KV slots.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"


class _Placeholder:
    """Stands in for any name of a module the SGLang radix cache imports but never uses on this path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __class_getitem__(cls, item: Any) -> type:
        return cls


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves placeholder modules for every `sglang.*` module except the few the radix cache really runs."""

    REAL = frozenset(
        {
            "sglang.srt.mem_cache.radix_cache",
            "sglang.srt.mem_cache.base_prefix_cache",
            "sglang.srt.mem_cache.cache_init_params",
            "sglang.srt.mem_cache.events",
            "sglang.srt.mem_cache.utils",
            "sglang.srt.mem_cache.evict_policy",
            "sglang.srt.mem_cache.unified_cache.component_type",
        }
    )

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith("sglang.") and fullname not in self.REAL:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "sglang.srt.utils.common":
            module.ceil_align = lambda x, align: -(-x // align) * align  # type: ignore[attr-defined]


def load_sglang(location: Path) -> tuple[types.ModuleType | None, str]:
    """Import SGLang's radix_cache from a pip --target directory on CPU. Returns (module, version or why not)."""
    source = location / "sglang" / "srt" / "mem_cache" / "radix_cache.py"
    if not source.is_file():
        return None, f"SGLang not found at {location} (install: pip install --no-deps --target {location} " + (
            f"sglang=={SGLANG_VERSION})"
        )
    version = "unknown"
    for info in location.glob("sglang-*.dist-info"):
        version = info.name.removeprefix("sglang-").removesuffix(".dist-info")
    # The package __init__ files pull in the whole server; register bare packages so only the modules
    # named in _PlaceholderFinder.REAL run, from their real files.
    for name, sub in (
        ("sglang", ""),
        ("sglang.srt", "srt"),
        ("sglang.srt.mem_cache", "srt/mem_cache"),
        ("sglang.srt.mem_cache.unified_cache", "srt/mem_cache/unified_cache"),
    ):
        package = types.ModuleType(name)
        package.__path__ = [str(location / "sglang" / sub)]
        sys.modules[name] = package
    sys.meta_path.insert(0, _PlaceholderFinder())
    try:
        import torch

        torch.set_num_threads(1)
        from sglang.srt.mem_cache import radix_cache
    except Exception as exc:
        return None, f"SGLang {version} at {location} failed to import: {type(exc).__name__}: {exc}"
    return radix_cache, version


class CpuSlotAllocator:
    """A CPU allocator of KV token slots, in pages, with the methods SGLang's RadixCache calls.

    Slots are handed out as int64 tensors of token indices, a whole page at a time; `free_segment` takes
    page-aligned token indices back. Freed pages are batched and merged into the free list on demand.
    """

    def __init__(self, torch: Any, capacity_pages: int, page_size: int) -> None:
        self.torch = torch
        self.device = "cpu"
        self.page_size = page_size
        self.free_pages = torch.arange(capacity_pages, dtype=torch.int64)
        self.released: list[Any] = []
        self.free_count = capacity_pages
        self.offsets = torch.arange(page_size, dtype=torch.int64)

    def available_size(self) -> int:
        return self.free_count * self.page_size

    def alloc_pages(self, n: int) -> Any:
        if len(self.free_pages) < n:
            self.free_pages = self.torch.cat([self.free_pages, *self.released])
            self.released.clear()
        pages = self.free_pages[:n]
        self.free_pages = self.free_pages[n:]
        self.free_count -= n
        if self.page_size == 1:
            return pages
        return (pages[:, None] * self.page_size + self.offsets).reshape(-1)

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        if len(indices) == 0:
            return
        pages = indices if self.page_size == 1 else indices[:: self.page_size] // self.page_size
        self.released.append(pages)
        self.free_count += len(pages)
