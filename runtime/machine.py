"""What this machine is, as far as the kernels care: the CPU's name and the instruction-set flags that change which
kernel is fastest (from /proc/cpuinfo), the load average, the memory's read bandwidth measured now, and how much
memory a device has in all.

The kernel choice (runtime.model.kernel_tune) keys its cache on `cpu_model()` and `kernel_flags()`; `radixcache
doctor` prints all of it with the bandwidth, which bounds batch-1 decode: every weight is read once per token.
"""

from __future__ import annotations

import os
import platform
import time

import torch

from radixcache.runtime.huge_pages import aligned_huge

# The flags that decide between kernels here: AVX2 and AVX-512 for the float32 products, the VNNI and AMX
# extensions for int8 dot products (llama.cpp's and oneDNN's quantised paths).
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8")
_CPUINFO = "/proc/cpuinfo"


def cpu_fields(path: str = _CPUINFO) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ("model name", "flags", ...); empty where it cannot be read
    (not Linux)."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break  # the end of the first processor's block
                    continue
                name, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(name.strip(), value.strip())
    except OSError:
        return {}
    return fields


def cpu_model(path: str = _CPUINFO) -> str:
    """The CPU's model name ("model name" in /proc/cpuinfo, else what the platform module says)."""
    fields = cpu_fields(path)
    return fields.get("model name") or platform.processor() or platform.machine() or "unknown"


def kernel_flags(path: str = _CPUINFO) -> tuple[str, ...]:
    """Which of KERNEL_FLAGS this CPU advertises, in KERNEL_FLAGS' order (its flags line, split on spaces)."""
    present = set(cpu_fields(path).get("flags", "").split())
    return tuple(flag for flag in KERNEL_FLAGS if flag in present)


def load_averages() -> tuple[float | None, float | None, float | None]:
    """The 1, 5 and 15-minute load averages; None each where the system has none (not Unix, or /proc/loadavg
    unreadable: os.getloadavg raises OSError)."""
    try:
        return os.getloadavg()
    except (OSError, AttributeError):
        return (None, None, None)


def load_average() -> float | None:
    """The one-minute load average (None where the system has none)."""
    return load_averages()[0]


def read_bandwidth_gbs(megabytes: int = 256, reps: int = 3, threads: int | None = None) -> float:
    """Read bandwidth now, in GB/s: the fastest of `reps` sums over a `megabytes` float32 tensor, with `threads`
    torch threads (default: the current count). Larger than any cache, so every sum streams from memory; the tensor
    lies in huge pages where Linux gives them, as the model's weights do (runtime.huge_pages): from 4 KiB pages the
    same sum read up to a fifth less, so a bound read from them would flatter the decode."""
    if megabytes < 1 or reps < 1:
        raise ValueError(f"megabytes and reps must be >= 1, got {megabytes} and {reps}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        data = aligned_huge(megabytes * 2**20)[0].view(torch.float32)
        data.fill_(1.0)  # the pages are touched once before any timing
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            data.sum()
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return data.numel() * 4 / best / 1e9


STEADY_TOLERANCE = 0.10  # two readings this close (a share of the larger) say the memory kept its speed


def bandwidth_steady(before: float, after: float, tolerance: float = STEADY_TOLERANCE) -> bool:
    """Whether two bandwidth readings taken around a measurement differ by at most `tolerance` of the larger. A
    shared host's memory can change speed within a second (this project's VM reads between about 35 and 68 GB/s):
    a decode between two readings that differ ran at some speed between them, so its share of a bound read from
    either says little."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    return abs(before - after) <= tolerance * max(before, after)


def run_queue_wait() -> float | None:
    """Seconds this process's threads have spent ready to run but waiting for a core, summed over its threads
    (Linux's /proc/self/task/*/schedstat, second field); None where that is not available. Only differences mean
    anything, and only over threads that live through both readings."""
    total, read = 0, False
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[1])
            read = True
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile, or no schedstat
    return total / 1e9 if read else None


def device_memory(device: torch.device) -> int | None:
    """Bytes of memory `device` has in all: the machine's physical memory for the CPU, the GPU's for CUDA; None
    where that cannot be told."""
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
            return None
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return None
