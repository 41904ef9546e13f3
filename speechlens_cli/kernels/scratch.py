"""Output buffers of the CPU kernels reused from one BiMamba call to the next.

Each CPU kernel writes into an MLX array MLX allocated, and MLX has no uninitialised allocation:
`mx.zeros` fills every new buffer first, single-threaded, at a few GB/s. Inside a BiMamba the
kernels' intermediates (in_proj halves, conv, x_proj, scan outputs) are 4.3 GiB per 1-s window
at 16 kHz, and that fill alone took ~0.9 s of a ~4-s window on 2 cores (Intel Xeon).

So the model runs each BiMamba's kernels inside `lend_scratch()`: outputs requested there come
from a pool of evaluated buffers, by element count, and go back to the pool when the scope
closes. The pool lives for one model call (`scratch_pool()`); outside one nothing changes.
This is sound only because on the CPU the kernels run eagerly and nothing made inside the
scope outlives it: the scope's result is made by `Lending.result`, which lends it nothing and
evaluates it while the buffers it reads are still untouched, and every other intermediate is
dead when the scope closes.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager

import mlx.core as mx
import numpy as np

from .. import runtime

#: Bytes the pool may hold (lent and free) before a new buffer lets go of the free ones of
#: other sizes. A window's BiMambas ask for two sizes, four buffers of one and one of the
#: other: 0.7 GB at 5 s / 16 kHz. The sequence groups of long windows ask for more sizes.
KEEP_BYTES = 2 << 30


class _Pool:
    def __init__(self):
        self.free: dict[int, list[mx.array]] = defaultdict(list)
        self.held = 0  # bytes of every buffer made here, lent or free

    def new(self, count: int) -> mx.array:
        """A new buffer of `count` floats, after letting go of free buffers of other sizes if
        keeping them would pass KEEP_BYTES."""
        if self.held + 4 * count > KEEP_BYTES:
            for size, buffers in self.free.items():
                if size != count:
                    self.held -= 4 * size * len(buffers)
                    buffers.clear()
        self.held += 4 * count
        return mx.zeros((count,), mx.float32)


class Lending:
    """The scope of one BiMamba call: buffers lent in it, returned when it closes."""

    def __init__(self, pool: _Pool | None):
        self.pool = pool
        self.lent: list[mx.array] = []
        self.open = pool is not None

    def take(self, shape) -> tuple[mx.array, np.ndarray] | None:
        """A pooled float32 buffer of `shape` (MLX array, writable NumPy view of the same
        memory), or None where none can be lent."""
        if not self.open:
            return None
        count = math.prod(shape)
        free = self.pool.free[count]
        flat = free.pop() if free else self.pool.new(count)
        out = flat.reshape(shape)
        mx.eval(out)
        view, base = np.asarray(out), np.asarray(flat)
        if not (view.flags.c_contiguous and view.flags.writeable
                and view.ctypes.data == base.ctypes.data):
            free.append(flat)  # MLX copied instead of viewing: not this buffer's memory
            return None
        self.lent.append(flat)
        return out, view

    def result(self, make: Callable[[], mx.array]) -> mx.array:
        """make()'s output, the scope's result: not lent, and evaluated (where lending is on)
        while the lent buffers it reads are still intact."""
        self.open = False
        out = make()
        if self.pool is not None:
            mx.eval(out)
        return out


class _State(threading.local):
    """Per thread: the open pool and lending scopes (threads enhancing at once share none)."""

    def __init__(self):
        self.pools: list[_Pool] = []
        self.scopes: list[Lending] = []


_state = _State()


@contextmanager
def scratch_pool():
    """A pool for the duration of one model call; on the CPU only (elsewhere kernels are lazy)."""
    if not runtime.current().on_cpu or _state.pools:
        yield
        return
    _state.pools.append(_Pool())
    try:
        yield
    finally:
        _state.pools.pop()


@contextmanager
def lend_scratch():
    """Kernel outputs requested inside come from the pool (if one is open) and return to it at
    the end; yields the Lending, whose result() must make the scope's result."""
    pools, scopes = _state.pools, _state.scopes
    scope = Lending(pools[-1] if pools and not scopes else None)
    scopes.append(scope)
    try:
        yield scope
    finally:
        scopes.pop()
        if scope.pool is not None:
            for flat in scope.lent:
                scope.pool.free[flat.size].append(flat)


def take(shape) -> tuple[mx.array, np.ndarray] | None:
    """A lent buffer for a kernel output of `shape` inside a lending scope, else None."""
    return _state.scopes[-1].take(shape) if _state.scopes else None
