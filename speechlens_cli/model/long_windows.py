"""The encoder and the decoders' full-resolution stage in tiles, for long windows.

The encoder's dense block and the decoders' last upsampling run at the STFT's full resolution:
one 64-channel plane of a 30-s window at 48 kHz is 1.5 GB, and the dense block holds its input,
four outputs and a layer's raw conv output at once (9.4 GiB for the encoder alone on an H200,
measured). Each of their layers ends in an InstanceNorm, whose statistics span the whole
plane, so a layer's output cannot be made one tile at a time before every tile of its conv has
been seen. Here nothing full-resolution is kept: the window is cut into time tiles, and

* each InstanceNorm's statistics are gathered over all tiles in a pass of their own (PlaneStats:
  each tile's mean and sum of squared deviations, merged), recomputing the layers below it from
  the input for each tile (a layer's time context comes from its neighbours' rows, which the
  tile computes too);
* the last pass makes the encoder's output, a quarter of the frames and half the bins, tile by
  tile; the decoders' last stage (a conv along time with one frame of context, then 1x1 heads)
  runs in time tiles too, computed twice (statistics, then output).

That costs the encoder about three times its compute (the dense block's layers are recomputed in
every later pass), so the model takes this path only where the full-resolution plane is larger
than LONG_PLANE_BYTES, and only on a GPU.
"""

from __future__ import annotations

import mlx.core as mx

from .. import runtime
from .layers import InstanceNorm, PlaneStats, PReLU, SubPixelConv
from .scheduling import in_turn, joined, plane_rows, rows_with_halo

#: A window whose full-resolution 64-channel plane is larger than this runs in tiles, by device
#: (runtime.Runtime.device):
#: on a GPU 30 s at 44.1 or 48 kHz (1.5 GB planes; 5-s windows, 247 MB at 48 kHz, never do);
#: never on the CPU (None), whose memory is the host's (8.7 GB at 30 s / 48 kHz, measured) and
#: whose encoder the tiles made 2.6x slower (5 s at 48 kHz: 8.7 -> 22.8 s, AMD EPYC, 2 cores).
LONG_PLANE_BYTES = {"cpu": None, "gpu": 512 * 2**20}
#: The full-resolution plane's rows per tile are sized so that a tile of it is about this large.
TILE_PLANE_BYTES = 64 * 2**20


def is_long(shape: tuple[int, ...], channels: int) -> bool:
    """Whether a full-resolution plane of `shape` [B, T, F, ...] with `channels` channels is
    over the default device's LONG_PLANE_BYTES."""
    batch, frames, bins = shape[:3]
    limit = LONG_PLANE_BYTES[runtime.current().device]
    return limit is not None and 4 * batch * frames * bins * channels > limit


def _spans(count: int, bytes_per_row: int, multiple: int = 1) -> list[tuple[int, int]]:
    """[start, end) tiles of `count` rows, about TILE_PLANE_BYTES each, every one a multiple
    of `multiple` rows long but the last."""
    size = max(multiple, TILE_PLANE_BYTES // max(bytes_per_row, 1) // multiple * multiple)
    return [(start, min(start + size, count)) for start in range(0, count, size)]


def _evaluate_in_turn(arrays) -> None:
    """Evaluate the lazy `arrays`, at most two pending: a tile's intermediates go as soon as
    what is kept of it (statistics, an output tile) is evaluated."""
    for _ in in_turn(arrays):
        pass


class TiledEncoder:
    """DenseEncoder.__call__ in time tiles (see the module docstring)."""

    def __init__(self, encoder):
        self.conv1, self.norm1, self.act1 = encoder.dense_conv_1
        self.layers = encoder.dense_block.dense_block  # [conv, norm, act] each
        self.conv2, self.norm2, self.act2 = encoder.dense_conv_2
        self.context = [conv.dilation[0] * (conv.weight.shape[1] // 2)
                        for conv, _, _ in self.layers]  # rows a layer reads on each side
        self.stats: list[PlaneStats] = []  # of the stages normalised so far

    def __call__(self, x: mx.array) -> mx.array:
        frames, bins = x.shape[1:3]
        channels = self.conv1.weight.shape[0]
        stride = self.conv2.stride[0]
        spans = _spans(frames, 4 * x.shape[0] * bins * channels, stride)
        # stage 0 is dense_conv_1's output, stage k the dense block's layer k: their
        # statistics in turn, each pass recomputing the normalised stages below
        for depth in range(len(self.layers) + 1):
            stats = PlaneStats()
            _evaluate_in_turn(stats.add(self._raw(x, depth, s, e)) for s, e in spans)
            self.stats.append(stats)
        outs, stats = [], PlaneStats()

        def output_tile(start: int, end: int) -> list[mx.array]:
            # dense_conv_2 has no time context: its stride-4 rows of [start, end) are its own
            outs.append(self.conv2(self._stages(x, start, end, len(self.layers) + 1)[-1][1]))
            return [outs[-1], *stats.add(outs[-1])]

        _evaluate_in_turn(output_tile(s, e) for s, e in spans)
        return joined(list(in_turn(self.norm2.normalise_with(outs.pop(0), stats, self.act2)
                                   for _ in spans)), axis=1)  # each raw tile let go in turn

    def _raw(self, x: mx.array, depth: int, start: int, end: int) -> mx.array:
        """Stage `depth`'s conv output (before its InstanceNorm) for rows [start, end)."""
        if depth == 0:
            return self.conv1(x[:, start:end])
        context = self.context[depth - 1]
        stages = self._stages(x, start - context, end + context, depth)
        return self._conv(depth, stages, start, end, x.shape[1])

    def _stages(self, x: mx.array, start: int, end: int,
                depth: int) -> list[tuple[int, mx.array]]:
        """(first row, rows) of the normalised stages [0, depth): the top one for rows [start,
        end), each one below over the rows the stage above it reads (its conv's context on
        each side), all within the plane."""
        frames = x.shape[1]
        spans = [(start, end)]
        for stage in range(depth - 2, -1, -1):  # stage + 1's conv reads stage and below
            lo, hi = spans[0]
            spans.insert(0, (lo - self.context[stage], hi + self.context[stage]))
        spans = [(max(lo, 0), min(hi, frames)) for lo, hi in spans]
        lo, hi = spans[0]
        stages = [(lo, self.norm1.normalise_with(self.conv1(x[:, lo:hi]), self.stats[0],
                                                 self.act1))]
        for stage in range(1, depth):
            lo, hi = spans[stage]
            _, norm, act = self.layers[stage - 1]
            raw = self._conv(stage, stages, lo, hi, frames)
            stages.append((lo, norm.normalise_with(raw, self.stats[stage], act)))
        return stages

    def _conv(self, layer: int, stages: list[tuple[int, mx.array]], start: int, end: int,
              frames: int) -> mx.array:
        """Dense layer `layer`'s conv of stages [0, layer) for rows [start, end), each input
        read with its time context (zeros beyond the plane)."""
        conv = self.layers[layer - 1][0]
        context = self.context[layer - 1]
        planes = [plane_rows(rows, first, start - context, end + context, frames)
                  for first, rows in reversed(stages)]  # newest first, as DenseBlock
        return conv.of_rows(planes)


def decode_last_stage(sub_pixel: SubPixelConv, norm: InstanceNorm, act: PReLU, head,
                      x: mx.array) -> mx.array:
    """head(act(norm(sub_pixel.along_height(x)))): the decoders' last upsampling (in time) and
    their 1x1 heads in time tiles, each read with its rows of context, the sub-pixel conv
    computed once for the statistics and once for the output. x [B, T', F, C] -> head's
    [B, ratio T', F]."""
    batch, frames, bins, channels = x.shape

    def upsampled(start: int, end: int) -> mx.array:
        return sub_pixel.along_height(rows_with_halo(x, start, end, sub_pixel.context),
                                      pad_height=0)

    spans = _spans(frames, 4 * batch * bins * sub_pixel.ratio * channels)
    stats = PlaneStats()
    _evaluate_in_turn(stats.add(upsampled(s, e)) for s, e in spans)
    return joined(list(in_turn(head(norm.normalise_with(upsampled(s, e), stats, act))
                               for s, e in spans)), axis=1)
