"""The Python API the CLI is built on; its defaults are the CLI's defaults."""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np

from . import checkpoint
from .errors import AudioInputError, UsageError
from .model.config import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE
from .model.semamba import SEMamba

ModelSpec = SEMamba | str | os.PathLike | None


def get_model(model: ModelSpec = None) -> SEMamba:
    """An already-loaded model passes through; anything else is resolved and loaded."""
    return model if isinstance(model, SEMamba) else checkpoint.load_model(model)


def check_sample_rate(sample_rate: int) -> None:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)):
        raise UsageError(f"sample rate must be an integer number of Hz, got {sample_rate!r}")
    if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise AudioInputError(
            f"sample rate {sample_rate} Hz is not supported "
            f"(RE-USE runs at {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz)"
        )


def enhance_channels(model: SEMamba, audio: np.ndarray, sample_rate: int, strict: bool) -> np.ndarray:
    """[N, C] float32 -> [N, C] float32, every channel through the model on its own."""
    out = np.empty(audio.shape, dtype=np.float32)
    for channel in range(audio.shape[1]):
        signal = mx.array(np.ascontiguousarray(audio[:, channel], dtype=np.float32))[None]
        enhanced = model.enhance(signal, sample_rate, strict=strict)
        mx.eval(enhanced)
        out[:, channel] = np.asarray(enhanced[0])
    return out


def enhance(
    audio: np.ndarray, sample_rate: int, *, model: ModelSpec = None, strict: bool = False
) -> np.ndarray:
    """Enhance a whole in-memory signal.

    `audio` is [N] or [N, channels] (soundfile's layout), float in [-1, 1] full scale; the result
    has the same shape, float32. Peaks above full scale are kept, never clipped or rescaled.
    """
    check_sample_rate(sample_rate)
    array = np.asarray(audio)
    if array.ndim not in (1, 2) or not np.issubdtype(array.dtype, np.number):
        raise UsageError(f"audio must be a 1-D or 2-D numeric array, got shape {array.shape}")
    frames = array.shape[0]
    if array.ndim == 2 and array.shape[1] == 0:
        raise AudioInputError("audio has no channels")
    if not np.isfinite(array).all():
        raise AudioInputError("audio contains NaN or Inf samples")
    net = get_model(model)
    minimum = net.config.stft_params(int(sample_rate)).n_fft
    if frames < minimum:
        raise AudioInputError(
            f"audio is too short: {frames} samples, one STFT frame needs {minimum} "
            f"at {sample_rate} Hz"
        )
    as_channels = array.reshape(frames, -1).astype(np.float32)
    out = enhance_channels(net, as_channels, int(sample_rate), strict)
    return out.reshape(array.shape)


def enhance_file(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    *,
    model: ModelSpec = None,
    strict: bool = False,
    overwrite: bool = False,
) -> dict:
    """Enhance one audio file into another with the same rate, channels, length and format."""
    from . import audio as audio_io
    from pathlib import Path

    source, destination = Path(source), Path(destination)
    if destination.exists() and destination.resolve() == source.resolve():
        raise UsageError(f"{destination}: output would overwrite the input")
    info = audio_io.read_info(source)
    check_sample_rate(info.sample_rate)
    with audio_io.atomic_output(destination, overwrite=overwrite) as temporary:
        data, info = audio_io.read(source)
        enhanced = enhance(data, info.sample_rate, model=model, strict=strict)
        enhanced, clamped = audio_io.clamp_for_subtype(enhanced, info)
        audio_io.write(temporary, enhanced, info)
    return {"input": str(source), "output": str(destination), "frames": info.frames,
            "sample_rate": info.sample_rate, "channels": info.channels, "clamped": clamped}
