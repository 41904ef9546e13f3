"""speechlens_cli.heap: large buffers stay in the process heap on Linux (glibc)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from speechlens_cli import heap

# Resident memory kept after a 128 MiB array is freed, in MiB.
PROBE = """
import os, numpy as np
from speechlens_cli import heap, runtime
runtime.prepare()
print(heap.status)
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
before = resident()
a = np.ones(2**25, np.float32); del a
print(int(resident() - before))
"""


def _probe(env_value: str | None) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != heap.HEAP_ENV}
    if env_value is not None:
        env[heap.HEAP_ENV] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, check=True).stdout.splitlines()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_freed_large_buffer_stays_in_the_heap_for_the_next_one():
    """Kept resident (reused by the next large array, no fresh pages to zero); with glibc's
    defaults it goes back to the kernel."""
    status, kept = _probe(None)
    assert status.startswith("glibc heap keeps large buffers")
    assert kept >= 100
    status, kept = _probe("default")
    assert status == f"glibc defaults ({heap.HEAP_ENV}=default)"
    assert kept < 20
