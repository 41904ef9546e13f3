"""What speechlens needs from libsndfile beyond soundfile's reading and writing: quiet native
output while probing, one-line reasons from its errors, and the two settings soundfile has no
public call for. Those two reach soundfile's cffi handles, here and nowhere else; a soundfile
release without them makes the determinism tests (no PEAK chunk in float WAV output) fail
rather than break silently."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

import soundfile as sf

#: What soundfile raises for a file libsndfile cannot open, read or write.
ERRORS = (sf.LibsndfileError, RuntimeError, OSError)
_OPENING = re.compile(r"^Error opening b?'.*?': ")
#: libsndfile's sf_command for "write a PEAK chunk" (sndfile.h).
_SFC_SET_ADD_PEAK_CHUNK = 0x1050


def native_path(path: str | os.PathLike) -> bytes:
    """The name as the operating system stores it, for every libsndfile call. soundfile encodes
    a str name strictly as UTF-8, so a name that is not valid UTF-8 (Python holds its bytes as
    surrogate escapes) raised UnicodeEncodeError; bytes reach libsndfile unchanged."""
    return os.fsencode(path)


def reason(error: Exception) -> str:
    """libsndfile's first line, without the "Error opening '<path>': " the caller already names
    (the path may be a temporary name that means nothing to users)."""
    lines = str(error).strip().splitlines()
    text = _OPENING.sub("", lines[0].strip()) if lines else ""
    return text or type(error).__name__


#: native_stderr_silenced's state, for threads that read at once (a batch reads ahead, writes
#: and scores behind the model): fd 2's saved copy, and how many are inside.
_SILENCE = threading.Lock()
_silenced = {"depth": 0, "saved": -1}


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Keep C libraries off file descriptor 2 while libsndfile probes bytes of unknown content
    (an input's header, a folder's file, stdin's first MiB), and nothing more.

    Its MPEG detection hands bytes that merely look like MPEG frames (b"\\xff\\xfb" junk,
    whatever its name) to libmpg123, which prints warnings straight to fd 2 ("Cannot read next
    header"); our one-line error says what failed. Fd 2 is the whole process's: while
    it points to /dev/null, another thread's line is lost too, so this is kept to those probes
    (a file already identified is decoded under decoding_silenced). Threads inside at once share
    one silence: the first in saves fd 2, the last one out puts it back (each saving and
    restoring its own, two overlapping threads left it pointing to /dev/null for good, and
    every later message, the interrupt's included, was lost).
    """
    if not _silence():
        yield
        return
    try:
        yield
    finally:
        with _SILENCE:
            _silenced["depth"] -= 1
            if not _silenced["depth"]:
                os.dup2(_silenced["saved"], 2)
                os.close(_silenced["saved"])


def decoding_silenced(subtype: str) -> contextlib.AbstractContextManager[None]:
    """The silence for opening and decoding a file libsndfile identified as `subtype`: only its
    MPEG decoder prints (libmpg123's resync notes on a damaged stream: an MPEG Layer III WAV is
    read here, an .mp3 through PyAV, whose FFmpeg logs nothing). Every other decoder, and each
    of formats.block_frames' probes, printed nothing to fd 2 (measured with libsndfile 1.2.2),
    so reading or reading back a WAV or FLAC never silences another thread's stderr."""
    return native_stderr_silenced() if subtype.startswith("MPEG") else contextlib.nullcontext()


def _silence() -> bool:
    """Point fd 2 to /dev/null (or keep it there); False where there is no fd 2 to save."""
    with _SILENCE:
        if not _silenced["depth"]:
            try:
                sys.stderr.flush()
                saved = os.dup(2)
            except (OSError, ValueError, AttributeError):  # no fd 2; a closed or replaced stderr
                return False
            try:
                quiet = os.open(os.devnull, os.O_WRONLY)
            except OSError:
                os.close(saved)
                return False
            try:
                os.dup2(quiet, 2)
            finally:
                os.close(quiet)
            _silenced["saved"] = saved
        _silenced["depth"] += 1
        return True


def _private_api():
    """soundfile's cffi handles (``_snd``: libsndfile, ``_ffi``), for what soundfile does not
    wrap; None when a soundfile release no longer has them."""
    snd, ffi = getattr(sf, "_snd", None), getattr(sf, "_ffi", None)
    return (snd, ffi) if snd is not None and ffi is not None else None


def leave_out_peak_chunk(sink: sf.SoundFile) -> None:
    """libsndfile stamps the wall-clock time into the PEAK chunk of float WAV/AIFF files, so the
    same input would not give byte-identical output twice; the chunk is optional (peak levels
    that readers may cache), so it is left out. Called before the first write, as required."""
    api = _private_api()
    if api is not None:
        snd, ffi = api
        with contextlib.suppress(Exception):
            snd.sf_command(sink._file, _SFC_SET_ADD_PEAK_CHUNK, ffi.NULL, 0)


def last_system_error() -> str | None:
    """The operating system's reason for libsndfile's last failed call ("No space left on
    device"), which libsndfile itself reports only as "System error."."""
    api = _private_api()
    code = getattr(api[1], "errno", 0) if api is not None else 0
    return os.strerror(code) if code else None
