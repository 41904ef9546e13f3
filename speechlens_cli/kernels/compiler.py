"""Compiling the CPU kernel library at run time, when no matching one was installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .. import settings
from .build import CPU_COMPILE_FLAGS, CPU_ENTRY, HASH_MACRO, define_flags
from .sources import kernel_source_dir


def find_cxx() -> str | None:
    """A C++ compiler: $CXX, else c++, g++ or clang++ on PATH."""
    for cand in (settings.CXX.value(), "c++", "g++", "clang++"):
        if cand and shutil.which(cand.split()[0]):
            return cand
    return None


def compile_cpu_library(dest: Path, source_hash: str, cxx: str | None = None) -> Path:
    """Compile kernels/cpu_kernels.cpp into the shared library ``dest`` (atomically)."""
    cxx = cxx or find_cxx()
    if cxx is None:
        raise OSError("no C++ compiler found (set CXX)")
    src = kernel_source_dir()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dest.name, suffix=".tmp", dir=dest.parent)
    os.close(fd)
    cmd = [*cxx.split(), *CPU_COMPILE_FLAGS, "-shared", f"-D{HASH_MACRO}=\"{source_hash}\"",
           *define_flags("cpu"), f"-I{src}", "-o", tmp, str(src / CPU_ENTRY)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise OSError(f"compiling the CPU kernels failed: {' '.join(cmd)}\n{proc.stderr}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest
