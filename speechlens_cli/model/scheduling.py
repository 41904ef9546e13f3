"""How the model's work is cut and scheduled so memory stays bounded: time tiles, groups, and
at most two stages pending on the device."""

from __future__ import annotations

import mlx.core as mx

from .. import runtime

#: A dense layer's time tile is sized so that its kernel-width taps take about this many bytes
#: (a tile builds nothing else: it reads the earlier outputs, kept padded, in place); the
#: full-resolution encoder then never holds the concatenation of all earlier outputs, or its
#: taps, for the whole window (30 s at 48 kHz: 5.9 GB and 17.8 GB). The CPU wants tiles that
#: stay in cache (encoder at 5 s / 16 kHz: 5.2 s with 16 MB tiles, 7.1 s with 64 MB); a GPU
#: wants few large ones (5 s / 44.1 kHz on an H200: 235 ms with 256 MB tiles, 273 ms with
#: 64 MB). Measured; both keep parity. By runtime.Runtime.device.
TILE_BYTES = {"cpu": 16 * 2**20, "gpu": 256 * 2**20}

class Pending:
    """A chain of stages of which at most two are pending on the device.

    A GPU holds every buffer of a pending graph until it completes: one lazy graph per window
    peaked at 25 GB at 5 s / 44.1 kHz on an H200 where one TF block needs ~3 GB (measured).
    `add` schedules a stage, then waits for the one before it: the device keeps working on the
    new stage while Python builds the next, so the bound costs no idle time, unlike a plain
    mx.eval per stage (+9% at 5 s / 44.1 kHz on the H200). One chain runs through all the TF
    blocks' BiMamba passes: with a chain per block, a block's first pass was scheduled while the
    block before still had its last pass pending (three passes at once).
    """

    def __init__(self):
        self.previous: mx.array | None = None

    def add(self, current: mx.array) -> mx.array:
        mx.async_eval(current)
        if self.previous is not None:
            mx.eval(self.previous)
        self.previous = current
        return current


def in_turn(arrays, chain: Pending | None = None):
    """Yield from `arrays` (lazy), each added to `chain` (a new one if None): at most two of
    them pending."""
    chain = Pending() if chain is None else chain
    for array in arrays:
        yield chain.add(array)


def tiles(count: int, bytes_per_item: int, budget: int) -> list[tuple[int, int]]:
    """[start, end) ranges covering `count` items, at least 16 per range, about `budget`
    bytes each; they depend only on the arguments, so results are reproducible."""
    size = max(16, budget // max(bytes_per_item, 1))
    return [(start, min(start + size, count)) for start in range(0, count, size)]


def joined(parts: list[mx.array], axis: int) -> mx.array:
    """The parts of a tiled or grouped result as one array (no copy for a single part)."""
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=axis)


def time_tiles(frames: int, width: int, in_channels: int,
               kernel_width: int) -> list[tuple[int, int]]:
    """Time tiles of a dense layer, sized for the default device (TILE_BYTES) by its tiles'
    kernel-width taps: float32, `kernel_width` * `in_channels` per cell of `width` cells a frame."""
    return tiles(frames, 4 * width * in_channels * kernel_width,
                 TILE_BYTES[runtime.current().device])


def rows_with_halo(x: mx.array, start: int, end: int, halo: int, width_pad: int = 0) -> mx.array:
    """Rows [start - halo, end + halo) of x [B, T, F, C], zeros outside the plane, and
    `width_pad` zero columns on each side."""
    return plane_rows(x, 0, start - halo, end + halo, x.shape[1], width_pad)


def plane_rows(part: mx.array, first: int, start: int, end: int, frames: int,
               width_pad: int = 0) -> mx.array:
    """Rows [start, end) of a plane of `frames` rows from `part`, its rows [first, first +
    len) (which hold every row of [start, end) inside the plane); zeros outside the plane,
    and `width_pad` zero columns on each side."""
    lo, hi = max(start, 0), min(end, frames)
    rows = part[:, lo - first:hi - first]
    before, after = lo - start, end - hi
    if before or after or width_pad:
        rows = mx.pad(rows, [(0, 0), (before, after), (width_pad, width_pad), (0, 0)])
    return rows
