"""Whether a cached build of the native kernels is whole, read from its ELF headers before it is loaded.

Why: a build cut short (a machine that crashed before the build's bytes reached the disk, a cache copied in part)
is still a file of the build's name. `dlopen` maps its segments as the headers say, and the first page past the
file's end is a SIGBUS: the process died at import, at every start, until the file was deleted. A whole build has
its section header table inside the file (ld writes it last) and every loaded segment's bytes too.
"""

from __future__ import annotations

import os
import struct

_ELF_MAGIC = b"\x7fELF"
_PT_LOAD = 1


def elf_intact(path: str | os.PathLike[str]) -> bool:
    """False for an ELF file whose section header table or a loaded segment runs past its end, and for a file too
    short to hold its own headers (an empty one included); True for a whole ELF file and for any other file (not
    ELF: the platform's loader refuses it with an error of its own)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(64)
            if head[:4] != _ELF_MAGIC:
                return len(head) >= 4  # an empty or 1-3 byte file is a cut build; another format, the loader's
            if len(head) < 52 or head[4] not in (1, 2) or head[5] not in (1, 2):
                return False
            wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
            if wide and len(head) < 64:
                return False
            fmt = "16xHHIQQQIHHHHHH" if wide else "16xHHIIIIIHHHHHH"
            _, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _ = struct.unpack_from(
                order + fmt, head
            )
            if shoff + shnum * shentsize > size or phoff + phnum * phentsize > size:
                return False
            if phnum and phentsize < (56 if wide else 32):  # entries smaller than a program header: not ld's
                return False
            f.seek(phoff)
            table = f.read(phnum * phentsize)
    except OSError:
        return False
    for i in range(phnum):
        at = i * phentsize
        if wide:
            p_type, _, offset, _, _, filesz = struct.unpack_from(order + "IIQQQQ", table, at)
        else:
            p_type, offset, _, _, filesz = struct.unpack_from(order + "IIIII", table, at)
        if p_type == _PT_LOAD and offset + filesz > size:
            return False
    return True
