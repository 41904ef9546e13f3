"""STFT and inverse STFT in MLX, matching torch.stft/istft(center=True, periodic Hann).

Spectra are kept as [batch, frames, bins], the layout the NHWC model consumes directly.
"""

from __future__ import annotations

from functools import lru_cache

import mlx.core as mx
import numpy as np

from .config import StftParams

#: pad_or_trim value the reference scripts use for the unreconstructed tail.
TAIL_FILL = 1e-8


def frame_count(num_samples: int, hop: int) -> int:
    return 1 + num_samples // hop


def _periodic_hann(n: int) -> np.ndarray:
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)


def _padded_positions(num_samples: int, pad: int) -> np.ndarray:
    """Source index of every sample of the centre-padded signal.

    Reflection without repeating the edge sample, clamped into the signal so that inputs too
    short to reflect (num_samples <= pad) still get a defined padding.
    """
    j = np.arange(-pad, num_samples + pad)
    j = np.where(j < 0, np.minimum(-j, num_samples - 1), j)
    j = np.where(j >= num_samples, np.maximum(2 * (num_samples - 1) - j, 0), j)
    return j


@lru_cache(maxsize=32)
def _analysis_plan(num_samples: int, p: StftParams) -> tuple[mx.array, mx.array, mx.array]:
    """Gather indices of every frame, the window, and where the spectrum is exactly real."""
    frames = frame_count(num_samples, p.hop)
    positions = _padded_positions(num_samples, p.n_fft // 2)
    index = positions[np.arange(frames)[:, None] * p.hop + np.arange(p.n_fft)[None, :]]
    window = mx.array(_periodic_hann(p.win).astype(np.float32))
    # A frame that mirrors itself about its centre (frame 0 under reflection, the last frame
    # when N mod hop == 1) has a purely real spectrum, and so do the DC and Nyquist bins.
    half = p.n_fft // 2
    offsets = np.arange(1, half)
    even = (index[:, half + offsets] == index[:, half - offsets]).all(axis=1)
    real_bins = even[:, None] | np.isin(np.arange(p.n_bins), (0, p.n_bins - 1))[None, :]
    return mx.array(index.reshape(-1).astype(np.int32)), window, mx.array(real_bins)


def stft(x: mx.array, p: StftParams) -> tuple[mx.array, mx.array]:
    """x [B, N] -> (log1p magnitude, phase), each [B, T, F] with T = 1 + N // hop.

    Bins whose exact spectrum is real (every bin of a mirror-symmetric frame: frame 0 under
    reflect padding, the last frame when N mod hop == 1; DC and Nyquist) get an imaginary part of
    exactly +0 (and signed zeros are made +0), so their phase is 0 or +pi on every backend
    instead of the sign of rounding noise, which differs between FFT libraries and which the
    model reads as an input: the result is deterministic and the same on CPU, Metal and CUDA.
    """
    batch, num_samples = x.shape
    index, window, real_bins = _analysis_plan(num_samples, p)
    frames = mx.take(x, index, axis=1).reshape(batch, -1, p.n_fft) * window
    spectrum = mx.fft.rfft(frames, axis=-1)
    real = spectrum.real + 0.0
    imag = mx.where(real_bins, mx.zeros_like(spectrum.imag), spectrum.imag) + 0.0
    magnitude = mx.sqrt(real * real + imag * imag)
    return mx.log1p(magnitude), mx.arctan2(imag, real)


@lru_cache(maxsize=32)
def _synthesis_plan(frames: int, p: StftParams) -> tuple[int, mx.array, mx.array]:
    """Window, and the reciprocal of the summed squared window over the kept output span."""
    segments = -(-p.n_fft // p.hop)
    window = _periodic_hann(p.win)
    envelope = np.zeros((frames + segments - 1) * p.hop)
    for t in range(frames):
        envelope[t * p.hop: t * p.hop + p.n_fft] += window**2
    start = p.n_fft // 2
    kept = envelope[start: start + p.hop * (frames - 1)]
    inverse = np.where(kept > 1e-11, 1.0 / np.maximum(kept, 1e-11), 0.0)
    return segments, mx.array(window.astype(np.float32)), mx.array(inverse.astype(np.float32))


def _overlap_add(frames: mx.array, hop: int, segments: int) -> mx.array:
    """Sum frames [B, T, n_fft] placed hop apart, as `segments` shifted adds of [B, T, hop]."""
    batch, count, n_fft = frames.shape
    frames = mx.pad(frames, [(0, 0), (0, 0), (0, segments * hop - n_fft)])
    frames = frames.reshape(batch, count, segments, hop)
    total = None
    for s in range(segments):
        shifted = mx.pad(frames[:, :, s, :], [(0, 0), (s, segments - 1 - s), (0, 0)])
        total = shifted if total is None else total + shifted
    return total.reshape(batch, -1)


def istft(
    log_magnitude: mx.array, phase: mx.array, p: StftParams, num_samples: int
) -> mx.array:
    """(log1p magnitude, phase) [B, T, F] -> waveform [B, num_samples]."""
    batch, frames, _ = log_magnitude.shape
    magnitude = mx.expm1(mx.maximum(log_magnitude, 0.0))
    spectrum = magnitude * mx.cos(phase) + 1j * (magnitude * mx.sin(phase))
    segments, window, inverse_envelope = _synthesis_plan(frames, p)
    signal = _overlap_add(mx.fft.irfft(spectrum, n=p.n_fft, axis=-1) * window, p.hop, segments)
    start = p.n_fft // 2
    signal = signal[:, start: start + p.hop * (frames - 1)] * inverse_envelope
    kept = signal.shape[1]
    if kept >= num_samples:
        return signal[:, :num_samples]
    return mx.pad(signal, [(0, 0), (0, num_samples - kept)], constant_values=TAIL_FILL)
