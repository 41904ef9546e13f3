"""Writing an output in one of libsndfile's containers block by block with soundfile, and
proving it complete afterwards."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import soundfile as sf

from ...errors import OutputError
from .. import libsndfile
from ..formats import OutputFormat, count_decoded, read_back_params
from .blocks import clamped, incomplete


def write_reason(error: Exception) -> str:
    """The operating system's reason for a failed write ("No space left on device") where there
    is one; libsndfile itself only says "System error."."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = libsndfile.reason(error)
    if "System error" in text:
        return libsndfile.last_system_error() or text
    return text


class Sink:
    """An output being written: blocks in order, integer encodings clamped to full scale (the
    samples clamped are counted), every failure an OutputError naming `shown`. An encoding that
    stores whole blocks (output.block) gets silence to the end of the last one when closed:
    `padding` frames, left out of `written`."""

    def __init__(self, path: str | Path, sample_rate: int, channels: int, output: OutputFormat,
                 shown: str):
        self.path, self.output, self.shown = path, output, shown
        self.sample_rate, self.channels = sample_rate, channels
        self.written = self.clamped = self.padding = 0
        try:
            self.file = sf.SoundFile(libsndfile.native_path(path), "w", sample_rate, channels,
                                     output.subtype, format=output.format)
        except libsndfile.ERRORS as error:
            raise OutputError(
                f"{shown}: cannot write {output.format}/{output.subtype} there "
                f"({write_reason(error)})"
            ) from None
        libsndfile.leave_out_peak_chunk(self.file)

    def write(self, block: np.ndarray) -> None:
        if self.output.is_integer:
            block, over = clamped(block)
            self.clamped += over
        self._write(block)
        self.written += len(block)

    def _write(self, block: np.ndarray) -> None:
        try:
            self.file.write(block)
        except (*libsndfile.ERRORS, AssertionError) as error:
            # soundfile asserts that every frame was written: a short write is a failure
            raise OutputError(f"{self.shown}: write failed ({write_reason(error)})") from None

    def abandon(self) -> None:
        """Close after a failure elsewhere; that failure is the one reported."""
        with contextlib.suppress(Exception):
            self.file.close()

    def close(self) -> None:
        """Pads the last block, flushes the encoder and finishes the header: it can fail too."""
        self.padding = -self.written % self.output.block
        if self.padding:
            try:
                self._write(np.zeros((self.padding, self.channels), np.float32))
            except OutputError:
                self.abandon()
                raise
        try:
            self.file.close()
        except libsndfile.ERRORS as error:
            raise OutputError(f"{self.shown}: write failed ({write_reason(error)})") from None

    def verify(self) -> None:
        """After close, read the file back in blocks: its header must count every frame written
        (padding included) and every one must decode (a headerless file is opened with the rate,
        channels and encoding it was written with: formats.read_back_params).

        Some write failures go unreported (a FLAC encoder's last block lost to a full disk
        leaves a short file with no length in its header, and libsndfile returns success); such
        a file must never be renamed into place as a finished output.
        """
        frames, path = self.written + self.padding, self.path
        params = read_back_params(self.output, self.sample_rate, self.channels)
        got, declared = 0, -1
        try:
            with libsndfile.decoding_silenced(self.output.subtype), \
                    sf.SoundFile(libsndfile.native_path(path), **params) as check:
                declared = check.frames
                got = count_decoded(check, frames)
        except libsndfile.ERRORS:
            pass
        if got != frames or declared != frames:
            if not os.path.exists(path):   # deleted under us: say so, not "disk full"
                what = ("its folder was" if not os.path.isdir(os.path.dirname(path) or ".")
                        else "it was")
                raise OutputError(f"{self.shown}: {what} removed while the file was being written")
            raise incomplete(self.shown, got, frames)
