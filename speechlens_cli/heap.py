"""Large buffers reused inside the process heap on Linux (glibc), instead of fresh pages.

MLX's CPU backend takes every array from malloc. glibc serves a request above its mmap threshold
(at most 32 MB) with fresh pages from the kernel and returns them on free, so each large
intermediate (a Mamba block's projections and kernel outputs: 132 MB each at 2 s / 16 kHz)
gets fresh pages that the kernel faults in and zeroes, every time: ~100 ms for one 132 MB
buffer, and a whole 2-s window ran 15% slower (measured on an AMD EPYC, 2 cores). With mmap
off and a high trim threshold, freed blocks stay in the heap and the next arrays reuse them;
the peak resident size was unchanged (404 MB either way at 2 s / 16 kHz).
SPEECHLENS_HEAP=default leaves glibc's settings alone.

Nothing changes at import: runtime.prepare() calls keep_large_buffers(), and runtime.restore()
calls restore().
"""

from __future__ import annotations

import ctypes
import sys

from . import settings

HEAP_ENV = settings.HEAP.name
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
#: Freed memory glibc keeps at the top of the heap before returning it to the kernel.
TRIM_THRESHOLD = 2**30
#: glibc's own values (malloc.c: DEFAULT_MMAP_MAX, DEFAULT_TRIM_THRESHOLD), for restore().
GLIBC_MMAP_MAX = 65536
GLIBC_TRIM_THRESHOLD = 128 * 1024

#: What was done (for `speechlens doctor` and bench reports).
status: str = "not attempted"
#: Whether glibc's settings are speechlens's now (keep_large_buffers succeeded).
kept: bool = False


def keep_large_buffers() -> str:
    """Switch glibc to serving large blocks from the heap and keeping them; returns status."""
    global status, kept
    if settings.HEAP.value():
        status = f"glibc defaults ({HEAP_ENV}=default)"
    elif not sys.platform.startswith("linux"):
        status = "system allocator (not Linux)"
    else:
        mallopt = _mallopt()
        if mallopt is None:
            status = "system allocator (no glibc mallopt)"
        elif mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
            status = "system allocator (mallopt refused)"
        else:
            status, kept = "glibc heap keeps large buffers (mmap off, trim threshold 1 GiB)", True
    return status


def restore() -> str:
    """glibc's default large-block settings again, where keep_large_buffers() changed them;
    returns status. (Its sliding mmap threshold stays off: any M_TRIM_THRESHOLD set turns it
    off, and mallopt cannot turn it back on.)"""
    global status, kept
    if kept:
        mallopt = _mallopt()
        mallopt(_M_MMAP_MAX, GLIBC_MMAP_MAX)
        mallopt(_M_TRIM_THRESHOLD, GLIBC_TRIM_THRESHOLD)
        status, kept = "glibc defaults (restored)", False
    return status


def _mallopt():
    try:  # the C library this process runs on: no search for one (ldconfig, in a subprocess)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt
