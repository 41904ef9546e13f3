"""The pages' pictures, drawn by matplotlib (its object API and Agg canvas: no pyplot state, no
display): a file's spectrograms before and after, and a batch's distribution of changes."""

from __future__ import annotations

import base64
import io
import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..scoring import extra
from .excerpt import Excerpt
from .scores import KEYS, ScoreChange

#: About 32 ms a frame at any rate; at most MAX_COLUMNS frames and ROWS log-spaced frequencies
#: from LOWEST_HZ drawn, so a 30-s excerpt at 48 kHz draws as fast as a short one.
FRAME_SECONDS = 0.032
MAX_COLUMNS = 600
ROWS = 240
LOWEST_HZ = 30.0
HERTZ_TICKS = (50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
#: The colour scale spans this far below the loudest bin of the input and output together.
DYNAMIC_RANGE_DB = 90.0


def _figure(width: float, height: float):
    extra.load("matplotlib")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _image_uri(figure, kind: str) -> str:
    """The figure as a data: URI: "jpeg" for a spectrogram (a fifth of its PNG's size, and
    quicker made), "png" for line art."""
    encoded = io.BytesIO()
    figure.savefig(encoded, format=kind, **({"pil_kwargs": {"quality": 85}}
                                            if kind == "jpeg" else {}))
    return f"data:image/{kind};base64," + base64.b64encode(encoded.getvalue()).decode("ascii")


def power_db(samples: np.ndarray, rate: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seconds [T], hertz [ROWS], dB full scale [ROWS, T]): a Hann-windowed STFT's power, read at
    log-spaced frequencies (linear between the two nearest bins)."""
    size = 2 ** round(math.log2(FRAME_SECONDS * rate))
    padded = np.pad(samples.astype(np.float64), (0, max(0, size - len(samples))))
    hop = max(size // 4, math.ceil((len(padded) - size + 1) / MAX_COLUMNS))
    frames = sliding_window_view(padded, size)[::hop]
    window = np.hanning(size)
    # scaled so a full-scale sine peaks at 0 dB
    power = (np.abs(np.fft.rfft(frames * window, axis=1)) / (window.sum() / 2)) ** 2
    hertz = np.geomspace(max(LOWEST_HZ, rate / size), rate / 2, ROWS)
    position = hertz * size / rate
    below = np.minimum(position.astype(int), size // 2 - 1)
    weight = (position - below)[:, None]
    rows = power.T[below] * (1 - weight) + power.T[below + 1] * weight
    seconds = (np.arange(len(frames)) * hop + size / 2) / rate
    return seconds, hertz, 10 * np.log10(rows + 1e-20)


def spectrograms(excerpt: Excerpt) -> str:
    """Input, output and removed part on one colour scale and a log-frequency axis, as a JPEG
    data: URI."""
    panels = [("input", excerpt.input), ("output", excerpt.output),
              ("removed (input - output)", excerpt.removed)]
    computed = [(title, *power_db(samples, excerpt.rate)) for title, samples in panels]
    top = max(decibels.max() for *_, decibels in computed[:2])
    figure = _figure(10, 8)
    axes = figure.subplots(3, 1, sharex=True, sharey=True)
    ticks = [tick for tick in HERTZ_TICKS if computed[0][2][0] <= tick <= computed[0][2][-1]]
    for axis, (title, seconds, hertz, decibels) in zip(axes, computed, strict=True):
        # rows evenly spaced in log frequency: an image on a log10(Hz) axis, labelled in Hz
        image = axis.imshow(decibels, origin="lower", aspect="auto", cmap="magma",
                            vmin=top - DYNAMIC_RANGE_DB, vmax=top, interpolation="nearest",
                            extent=(0.0, seconds[-1] + seconds[0],
                                    math.log10(hertz[0]), math.log10(hertz[-1])))
        axis.set_yticks([math.log10(tick) for tick in ticks],
                        [f"{tick // 1000}k" if tick >= 1000 else str(tick) for tick in ticks])
        axis.set_title(title, loc="left")
        axis.set_ylabel("Hz")
    axes[-1].set_xlabel("seconds")
    figure.colorbar(image, ax=axes, label="dB full scale (one scale for all three)")
    return _image_uri(figure, "jpeg")


def change_histograms(changes: list[ScoreChange]) -> str:
    """How each score changed across a batch: one histogram per score, 0 (no change) marked,
    as a PNG data: URI."""
    figure = _figure(10, 5.5)
    axes = figure.subplots(2, 2)
    for axis, key in zip(axes.flat, KEYS, strict=True):
        values = [getattr(change.change, key) for change in changes]
        axis.hist(values, bins=min(30, max(5, len(values))), color="#4c72b0")
        axis.axvline(0.0, color="#c44e52", linewidth=1)
        axis.set_title(f"{key.upper()} change (output - input)", loc="left")
        axis.set_ylabel("files")
    return _image_uri(figure, "png")
