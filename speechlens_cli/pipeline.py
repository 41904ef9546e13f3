"""Streaming enhancement: read blocks, run fixed-length windows, cross-fade, write as they finish.

Memory depends on the window length, never on the file length: the input is read a window at a
time, each window is evaluated before the next is built, and only the cross-fade tail of the
previous window is carried over. Every window except in files shorter than one window has the
same length (the last one is aligned to the end of the file), so MLX reuses the same buffers.

The defaults and limits here are the single source for the CLI and the Python API.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
import soundfile as sf

from .audio import OutputFormat, decode_error, native_stderr_silenced, open_reader
from .errors import AudioInputError, OutputError, UsageError

DEFAULT_CHUNK_SECONDS = 5.0
CHUNK_SECONDS_RANGE = (5.0, 30.0)
DEFAULT_OVERLAP = 0.05
OVERLAP_RANGE = (0.0, 0.5)
DEVICES = ("auto", "gpu", "cpu")
DEFAULT_DEVICE = "auto"
#: Freed MLX buffers kept for reuse. Windows all have one length, so a small pool is enough.
CACHE_LIMIT_BYTES = 256 * 1024 * 1024
#: Frames per read when a finished output is read back to check it.
_CHECK_BLOCK = 1 << 16
#: libsndfile's sf_command for "write a PEAK chunk" (sndfile.h).
_SFC_SET_ADD_PEAK_CHUNK = 0x1050

WindowFn = Callable[[np.ndarray], np.ndarray]
ProgressFn = Callable[[int], None]


@dataclass(frozen=True)
class Geometry:
    """Window length and cross-fade length, in samples."""

    chunk: int
    overlap: int

    def __post_init__(self) -> None:
        if self.chunk < 1 or not 0 <= self.overlap <= self.chunk // 2:
            raise UsageError(
                f"window of {self.chunk} samples with {self.overlap} overlap: need a window of at "
                "least 1 sample and an overlap of at most half of it"
            )

    @classmethod
    def from_seconds(cls, chunk_seconds: float, overlap: float, sample_rate: int) -> Geometry:
        """Seconds and a fraction of the window -> samples (NVIDIA's int(portion * chunk))."""
        chunk = max(1, round(chunk_seconds * sample_rate))
        return cls(chunk, int(overlap * chunk))

    @property
    def hop(self) -> int:
        return self.chunk - self.overlap

    def starts(self, frames: int) -> list[int]:
        """Window starts: every hop while a window ends before the file does, then one ending
        at it."""
        starts = list(range(0, max(frames - self.chunk, 0), self.hop))
        starts.append(max(frames - self.chunk, 0))
        return starts


def check_settings(chunk_seconds: float, overlap: float) -> None:
    """The CLI's and the API's accepted window geometry."""
    low, high = CHUNK_SECONDS_RANGE
    if not low <= chunk_seconds <= high:
        raise UsageError(f"chunk length {chunk_seconds:g} s is outside {low:g}-{high:g} s")
    low, high = OVERLAP_RANGE
    if not low <= overlap <= high:
        raise UsageError(f"overlap {overlap:g} is outside {low:g}-{high:g} of the window")


def crossfade_weights(length: int) -> tuple[np.ndarray, np.ndarray]:
    """sin^2 fade-in and cos^2 fade-out over `length` samples, as [length, 1] float64."""
    t = (np.arange(length, dtype=np.float64) + 0.5) / max(length, 1)
    fade_in = np.sin(0.5 * math.pi * t) ** 2
    return fade_in[:, None], (1.0 - fade_in)[:, None]


@contextlib.contextmanager
def bounded_cache(limit: int = CACHE_LIMIT_BYTES) -> Iterator[None]:
    """Cap MLX's buffer cache for the duration of a run, then restore the caller's limit."""
    previous = mx.set_cache_limit(limit)
    try:
        yield
    finally:
        mx.set_cache_limit(previous)
        mx.clear_cache()


@dataclass(frozen=True)
class StreamResult:
    frames: int
    windows: int
    clamped: int


class _WindowReader:
    """Hands out windows in increasing order while holding at most one window of input."""

    def __init__(self, handle: sf.SoundFile, frames: int, name: str):
        self.handle, self.frames, self.name = handle, frames, name
        self.buffer = np.zeros((0, handle.channels), np.float32)
        self.origin = 0  # file position of buffer[0]

    def window(self, start: int, end: int) -> np.ndarray:
        self.buffer = self.buffer[max(start - self.origin, 0):]
        self.origin = max(start, self.origin)
        missing = end - (self.origin + len(self.buffer))
        if missing > 0:
            try:
                with native_stderr_silenced():  # libmpg123 prints resync notes to fd 2
                    block = self.handle.read(missing, dtype="float32", always_2d=True)
            except (sf.LibsndfileError, RuntimeError, OSError) as error:
                raise decode_error(self.name, error) from None
            if len(block) < missing:
                got = self.origin + len(self.buffer) + len(block)
                raise AudioInputError(
                    f"{self.name}: truncated (audio ends at frame {got} of {self.frames})"
                )
            if not np.isfinite(block).all():
                raise AudioInputError(f"{self.name}: contains NaN or Inf samples")
            self.buffer = np.concatenate([self.buffer, block]) if len(self.buffer) else block
        return self.buffer[start - self.origin:end - self.origin]


def _write_reason(error: Exception) -> str:
    """The operating system's reason for a failed write ("No space left on device") where there
    is one; libsndfile itself only says "System error."."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = re.sub(r"^Error opening '.*?': ", "", text)  # the temporary name means nothing to users
    if "System error" in text:
        code = getattr(getattr(sf, "_ffi", None), "errno", 0)  # errno of libsndfile's last call
        if code:
            return os.strerror(code)
    return text


def _open_sink(path, sample_rate: int, channels: int, output: OutputFormat,
               shown: str) -> sf.SoundFile:
    try:
        sink = sf.SoundFile(str(path), "w", sample_rate, channels, output.subtype,
                            format=output.format)
    except (sf.LibsndfileError, RuntimeError, OSError) as error:
        raise OutputError(
            f"{shown}: cannot write {output.format}/{output.subtype} there "
            f"({_write_reason(error)})"
        ) from None
    _leave_out_peak_chunk(sink)
    return sink


def _leave_out_peak_chunk(sink: sf.SoundFile) -> None:
    """libsndfile stamps the wall-clock time into the PEAK chunk of float WAV/AIFF files, so the
    same input would not give byte-identical output twice; the chunk is optional (peak levels
    that readers may cache), so it is left out. Called before the first write, as required."""
    snd, ffi = getattr(sf, "_snd", None), getattr(sf, "_ffi", None)
    if snd is not None and ffi is not None:
        with contextlib.suppress(Exception):
            snd.sf_command(sink._file, _SFC_SET_ADD_PEAK_CHUNK, ffi.NULL, 0)


def _check_written(path, frames: int, shown: str) -> None:
    """Read the closed output back in blocks: every frame must decode.

    Some write failures go unreported (a FLAC encoder's last block lost to a full disk leaves a
    short file with no length in its header, and libsndfile returns success); such a file must
    never be renamed into place as a finished output.
    """
    got, declared = 0, -1
    try:
        with native_stderr_silenced(), sf.SoundFile(str(path)) as check:
            declared = check.frames
            width = 2 * check.channels  # decoded as int16: all that is needed is the count
            while got < frames:
                block = check.buffer_read(min(_CHECK_BLOCK, frames - got), dtype="int16")
                if not len(block):
                    break
                got += len(block) // width
    except (sf.LibsndfileError, RuntimeError, OSError):
        pass
    if got != frames or declared != frames:
        if not os.path.exists(path):   # deleted under us: say so, not "disk full"
            what = "its folder was" if not os.path.isdir(os.path.dirname(path) or ".") else "it was"
            raise OutputError(f"{shown}: {what} removed while the file was being written")
        raise OutputError(
            f"{shown}: the written file does not read back complete ({got} of {frames} frames "
            "decode): the disk may be full"
        )


def enhance_stream(
    source: str | Path,
    destination: str | Path,
    enhance_window: WindowFn,
    geometry: Geometry,
    output: OutputFormat,
    *,
    name: str | None = None,
    progress: ProgressFn | None = None,
    output_name: str | None = None,
) -> StreamResult:
    """Enhance `source` into `destination` window by window, writing each block once it is final.

    `enhance_window` maps float32 [n, channels] to the enhanced [n, channels] (evaluated).
    Where windows overlap by `geometry.overlap` samples, the earlier one fades out (cos^2) as the
    later one fades in (sin^2), divided by the summed weight; elsewhere each output sample comes
    from exactly one window. The last window ends at the end of the file, so every window but
    that of a file shorter than one window has the full length.

    `output_name` names the output in error messages (`destination` may be a temporary name).
    The closed output is read back before returning; a window the model turns into NaN or Inf
    (finite input far beyond full scale overflows the STFT) stops the file, never reaching it.
    """
    name = name or str(source)
    shown = output_name or str(destination)
    with open_reader(source, name) as (handle, info), bounded_cache():
        reader = _WindowReader(handle, info.frames, name)
        starts = geometry.starts(info.frames)
        clamped = written = 0
        tail = np.zeros((0, info.channels), np.float32)  # previous window's cross-fade region
        sink = _open_sink(destination, info.sample_rate, info.channels, output, shown)

        def emit(block: np.ndarray) -> None:
            nonlocal clamped, written
            if output.is_integer:
                over = int(np.count_nonzero(np.abs(block) > 1.0))
                if over:
                    clamped += over
                    block = np.clip(block, -1.0, 1.0)
            try:
                sink.write(block)
            except (sf.LibsndfileError, RuntimeError, OSError, AssertionError) as error:
                # soundfile asserts that every frame was written: a short write is a failure
                raise OutputError(f"{shown}: write failed ({_write_reason(error)})") from None
            written += len(block)
            if progress is not None:
                progress(written)

        try:
            for index, start in enumerate(starts):
                end = min(start + geometry.chunk, info.frames)
                window = reader.window(start, end)
                enhanced = enhance_window(window)
                if not np.isfinite(enhanced).all():
                    raise AudioInputError(
                        f"{name}: the model output NaN or Inf for the window at "
                        f"{start / info.sample_rate:.2f} s (the input peaks at "
                        f"{float(np.abs(window).max()):.3g} times full scale there)"
                    )
                if len(tail):
                    fade_in, fade_out = crossfade_weights(len(tail))
                    head = enhanced[written - start:written - start + len(tail)]
                    mixed = (tail * fade_out + head * fade_in) / (fade_out + fade_in)
                    emit(mixed.astype(np.float32))
                final = end if index == len(starts) - 1 else end - geometry.overlap
                emit(enhanced[written - start:final - start])
                tail = enhanced[final - start:]
        except BaseException:
            with contextlib.suppress(Exception):
                sink.close()
            raise
        try:
            sink.close()  # flushes the encoder and finishes the header: it can fail too
        except (sf.LibsndfileError, RuntimeError, OSError) as error:
            raise OutputError(f"{shown}: write failed ({_write_reason(error)})") from None
    _check_written(destination, written, shown)
    return StreamResult(written, len(starts), clamped)
