"""Audio file I/O with soundfile: keep rate, channels, container and subtype; write atomically."""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from .errors import AudioInputError, OutputError


@dataclass(frozen=True)
class AudioInfo:
    frames: int
    sample_rate: int
    channels: int
    format: str
    subtype: str

    @property
    def is_integer(self) -> bool:
        return self.subtype.startswith("PCM") or self.subtype in ("ALAC_16", "ALAC_20", "ALAC_24")


def read_info(path: str | os.PathLike) -> AudioInfo:
    path = Path(path)
    if path.is_dir():
        raise AudioInputError(f"{path}: is a folder, not an audio file")
    if not path.exists():
        raise AudioInputError(f"{path}: no such file")
    try:
        info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError, OSError) as error:
        raise AudioInputError(f"{path}: not a readable audio file ({_reason(error)})") from None
    if info.frames <= 0:
        raise AudioInputError(f"{path}: contains no audio frames")
    if info.channels <= 0:
        raise AudioInputError(f"{path}: has no channels")
    return AudioInfo(info.frames, info.samplerate, info.channels, info.format, info.subtype)


def read(path: str | os.PathLike) -> tuple[np.ndarray, AudioInfo]:
    """The whole file as float32 [frames, channels] in [-1, 1] full scale."""
    info = read_info(path)
    try:
        data, _ = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as error:
        raise AudioInputError(f"{path}: could not be decoded ({_reason(error)})") from None
    if data.shape[0] == 0:
        raise AudioInputError(f"{path}: contains no audio frames")
    return data, info


def _reason(error: Exception) -> str:
    return str(error).splitlines()[0].strip() or type(error).__name__


def clamp_for_subtype(data: np.ndarray, info: AudioInfo) -> tuple[np.ndarray, int]:
    """Integer formats cannot hold peaks beyond full scale: clamp and count them."""
    if not info.is_integer:
        return data, 0
    over = int(np.count_nonzero(np.abs(data) > 1.0))
    return (np.clip(data, -1.0, 1.0) if over else data), over


@contextlib.contextmanager
def atomic_output(destination: str | os.PathLike, *, overwrite: bool):
    """Yield a temporary path beside `destination`; rename it into place only on success."""
    destination = Path(destination)
    if destination.exists() and not overwrite:
        raise OutputError(f"{destination}: already exists (use --overwrite to replace it)")
    folder = destination.parent if str(destination.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"{folder}: output folder does not exist")
    try:
        handle, temporary = tempfile.mkstemp(
            prefix=f".{destination.name}.", suffix=".partial", dir=folder
        )
    except OSError as error:
        raise OutputError(f"{folder}: not writable ({error.strerror})") from None
    os.close(handle)
    try:
        yield Path(temporary)
        os.replace(temporary, destination)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def write(path: str | os.PathLike, data: np.ndarray, info: AudioInfo) -> None:
    sf.write(str(path), data, info.sample_rate, subtype=info.subtype, format=info.format)
