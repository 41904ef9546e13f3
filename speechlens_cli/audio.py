"""Audio files with soundfile: what they hold, where outputs go, and writing them atomically."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import soundfile as sf

from .errors import AudioInputError, OutputError, OutputExistsError, UsageError

#: Most channels a file may have: mono, stereo, 5.1 and 7.1 all fit. Each channel is enhanced on
#: its own, so time and window memory grow with the count; a header claiming hundreds of channels
#: is far more likely damage than a recording.
MAX_CHANNELS = 8

_INTEGER_SUBTYPES = ("ALAC_16", "ALAC_20", "ALAC_24", "ALAC_32")
#: Suffixes that name a soundfile container besides the format names themselves (".wav", ...).
_SUFFIX_ALIASES = {".aif": "AIFF", ".oga": "OGG", ".snd": "AU"}
#: libsndfile's log line for a WAV data chunk longer than the file: "data : 16000 (should be 7978)".
_DATA_SHORTFALL = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
#: Data sizes that streaming writers put in a WAV header when they cannot seek back.
_STREAMED_SIZES = (0, 0xFFFFFFFF)
_OPENING = re.compile(r"^Error opening '.*?': ")
#: libsndfile's reason when its MPEG probe gives up on bytes that merely looked like MP3.
_MISLEADING_REASON = "File does not exist or is not a regular file"
#: Frame counts from here up mean "not recorded" (libsndfile reports SF_COUNT_MAX for a FLAC
#: streamed without a length); soundfile cannot read such a file past its first block.
_UNKNOWN_FRAMES = 1 << 62
_COPY_BLOCK = 1 << 20
#: link() errors meaning "this file system has no hard links": fall back to check-then-rename.
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV,
                  errno.ENOSYS}


@dataclass(frozen=True)
class AudioInfo:
    frames: int
    sample_rate: int
    channels: int
    format: str
    subtype: str

    @property
    def seconds(self) -> float:
        return self.frames / self.sample_rate


@dataclass(frozen=True)
class OutputFormat:
    format: str
    subtype: str

    @property
    def is_integer(self) -> bool:
        """Integer encodings cannot hold peaks beyond full scale: they are clamped and counted."""
        return self.subtype.startswith("PCM") or self.subtype in _INTEGER_SUBTYPES


def _reason(error: Exception) -> str:
    """libsndfile's first line, without the "Error opening '<path>': " the caller already names."""
    lines = str(error).strip().splitlines()
    text = _OPENING.sub("", lines[0].strip()) if lines else ""
    return text or type(error).__name__


def decode_error(name: str, error: Exception) -> AudioInputError:
    return AudioInputError(f"{name}: could not be decoded ({_reason(error)})")


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Keep C libraries off file descriptor 2 for a moment.

    libsndfile's MPEG decoder (libmpg123) prints notes and warnings straight to fd 2 while it
    probes bytes that are not MP3 or resyncs a damaged one; our one-line error says what failed.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no fd 2, or a closed/replaced sys.stderr
        yield
        return
    try:
        quiet = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(quiet, 2)
        finally:
            os.close(quiet)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def read_info(path: str | os.PathLike, name: str | None = None) -> AudioInfo:
    """Header facts of an audio file, or the typed error that says why it cannot be enhanced."""
    path = Path(path)
    name = name or str(path)
    if path.is_dir():
        raise AudioInputError(f"{name}: is a folder, not an audio file")
    if not path.exists():
        raise AudioInputError(f"{name}: no such file")
    if not path.is_file():  # a FIFO would block the reader forever
        raise AudioInputError(f"{name}: not a regular file (a pipe, socket or device); "
                              "use '-' to read a stream from stdin")
    if path.stat().st_size == 0:
        raise AudioInputError(f"{name}: is empty (0 bytes)")
    try:
        with native_stderr_silenced():
            info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError, OSError) as error:
        reason = _reason(error)
        if reason.startswith(_MISLEADING_REASON) and path.is_file():
            reason = "format not recognised"
        raise AudioInputError(f"{name}: not a readable audio file ({reason})") from None
    if info.frames <= 0:
        raise AudioInputError(f"{name}: contains no audio frames")
    if info.frames >= _UNKNOWN_FRAMES:
        raise AudioInputError(
            f"{name}: its header does not record the length (a stream cut short or written to "
            "a pipe); re-encode it to a file"
        )
    if info.channels <= 0:
        raise AudioInputError(f"{name}: has no channels")
    if info.channels > MAX_CHANNELS:
        raise AudioInputError(
            f"{name}: has {info.channels} channels; speechlens enhances at most {MAX_CHANNELS} "
            "(split it into files of fewer channels first)"
        )
    shortfall = _DATA_SHORTFALL.search(info.extra_info or "")
    if shortfall:
        declared, present = (int(v) for v in shortfall.groups())
        if declared > present and declared not in _STREAMED_SIZES:
            raise AudioInputError(
                f"{name}: truncated (header promises {declared} bytes of audio, "
                f"file holds {present})"
            )
    return AudioInfo(info.frames, info.samplerate, info.channels, info.format, info.subtype)


@contextlib.contextmanager
def open_reader(path: str | os.PathLike, name: str) -> Iterator[tuple[sf.SoundFile, AudioInfo]]:
    info = read_info(path, name)
    try:
        with native_stderr_silenced():
            handle = sf.SoundFile(str(path))
    except (sf.LibsndfileError, RuntimeError, OSError) as error:
        raise decode_error(name, error) from None
    with handle:
        yield handle, info


def format_for_suffix(suffix: str) -> str | None:
    """The soundfile container a file suffix names, if any (".flac" -> "FLAC")."""
    suffix = suffix.lower()
    if suffix in _SUFFIX_ALIASES:
        return _SUFFIX_ALIASES[suffix]
    name = suffix.lstrip(".").upper()
    return name if name and name in sf.available_formats() else None


def output_format(info: AudioInfo, destination: str | os.PathLike | None,
                  subtype: str | None = None, *, container: str | None = None) -> OutputFormat:
    """Keep the input's container and subtype unless the caller asks otherwise.

    A destination whose suffix differs from the input's and names another container (in.wav ->
    out.flac) asks for that container; `container` forces one (stdout is always WAV). A subtype
    the new container cannot hold falls back to that container's default.
    """
    fmt = container or info.format
    if container is None and destination is not None:
        wanted = format_for_suffix(Path(destination).suffix)
        if wanted is not None and wanted != info.format:
            fmt = wanted
    if subtype is not None:
        subtype = subtype.upper()
        if not sf.check_format(fmt, subtype) or not _can_write(fmt, subtype, info):
            raise UsageError(f"subtype {subtype} cannot be written in a {fmt} file"
                             + _shape_note(fmt, subtype, info))
        return OutputFormat(fmt, subtype)
    # libsndfile reads some encodings it cannot write (an MP3 stream in a WAV file), and some
    # containers limit rates and channels: try the encoding on an empty in-memory file first.
    if sf.check_format(fmt, info.subtype) and _can_write(fmt, info.subtype, info):
        return OutputFormat(fmt, info.subtype)
    fallback = sf.default_subtype(fmt)
    if fallback is None or not _can_write(fmt, fallback, info):
        raise OutputError(f"{destination or 'output'}: a {fmt} file cannot hold "
                          f"{info.channels} channel(s) at {info.sample_rate} Hz; choose another "
                          "container (e.g. .wav)")
    return OutputFormat(fmt, fallback)


def _can_write(fmt: str, subtype: str, info: AudioInfo) -> bool:
    try:
        with native_stderr_silenced(), sf.SoundFile(io.BytesIO(), "w", info.sample_rate,
                                                    info.channels, subtype, format=fmt):
            pass
    except (sf.LibsndfileError, RuntimeError, ValueError, TypeError, OSError):
        return False
    return True


def _shape_note(fmt: str, subtype: str, info: AudioInfo) -> str:
    if sf.check_format(fmt, subtype):  # a valid pair refused for this rate or channel count
        return f" at {info.sample_rate} Hz with {info.channels} channel(s)"
    return ""


def check_subtype_name(subtype: str) -> None:
    if subtype.upper() not in sf.available_subtypes():
        raise UsageError(f"unknown subtype {subtype!r} (for example PCM_16, PCM_24, FLOAT)")


def check_writable(folder: Path) -> None:
    """Prove `folder` accepts new files by creating and removing one (root ignores permissions)."""
    if not folder.is_dir():
        raise OutputError(f"{folder}: output folder does not exist")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise OutputError(f"{folder}: not writable ({error.strerror or error})") from None


def nearest_existing(folder: Path) -> Path:
    """`folder` or its closest existing ancestor: where a folder still to be made would go."""
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return folder


def same_file(a: Path, b: Path) -> bool:
    """True when writing `b` would replace `a` (symlinks, "..", hard links included)."""
    if a.resolve() == b.resolve():
        return True
    with contextlib.suppress(OSError):
        return os.path.samefile(a, b)
    return False


@contextlib.contextmanager
def atomic_output(destination: str | os.PathLike, *, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary path beside `destination`; rename it into place only on success.

    The temporary file is removed on any failure, Ctrl-C included.
    """
    destination = Path(destination)
    if destination.exists() and not overwrite:
        raise OutputExistsError(f"{destination}: already exists (use --overwrite to replace it)")
    folder = destination.parent
    if not folder.is_dir():
        raise OutputError(f"{folder}: output folder does not exist")
    temporary = None
    try:
        # The name is recorded before the file exists, so an interrupt at any point after
        # creation still finds it to remove.
        while temporary is None:
            temporary = folder / f".{destination.name}.{secrets.token_hex(6)}.partial"
            try:
                os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            except FileExistsError:
                temporary = None
            except OSError as error:
                temporary = None
                raise OutputError(f"{folder}: not writable ({error.strerror or error})") from None
        yield temporary
        _publish(temporary, destination, overwrite=overwrite)
    finally:
        if temporary is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)


def _publish(temporary: Path, destination: Path, *, overwrite: bool) -> None:
    """Give the finished temporary file its final name.

    Without `overwrite` an existing file is never replaced, not even one another process created
    while this one was enhancing: a hard link fails when the name is taken (the caller removes
    the temporary name). File systems without hard links get a check, then a rename.
    """
    try:
        if overwrite:
            os.replace(temporary, destination)
            return
        try:
            os.link(temporary, destination)
            return
        except FileExistsError:
            raise OutputExistsError(
                f"{destination}: already exists (created by another process meanwhile; "
                "use --overwrite to replace it)"
            ) from None
        except OSError as error:
            if error.errno not in _NO_HARD_LINKS:
                raise
        if destination.exists():
            raise OutputExistsError(
                f"{destination}: already exists (use --overwrite to replace it)")
        os.replace(temporary, destination)
    except OSError as error:
        if not destination.parent.is_dir():
            raise OutputError(
                f"{destination}: its folder was removed while the file was being written"
            ) from None
        raise OutputError(f"{destination}: could not be written ({error.strerror or error})") \
            from None


@contextlib.contextmanager
def spooled_stdin(stream: BinaryIO) -> Iterator[Path]:
    """Copy a (non-seekable) input stream to a temporary file, so it can be streamed by blocks."""
    folder = tempfile.gettempdir()
    try:
        handle, temporary = tempfile.mkstemp(prefix="speechlens-stdin.", suffix=".wav")
    except OSError as error:
        raise OutputError(f"<stdin>: cannot be buffered in {folder} ({error.strerror or error}); "
                          "set TMPDIR to a writable folder") from None
    try:
        try:
            with os.fdopen(handle, "wb") as sink:
                shutil.copyfileobj(stream, sink, _COPY_BLOCK)
        except OSError as error:
            raise OutputError(f"<stdin>: could not be buffered in {folder} "
                              f"({error.strerror or error}); set TMPDIR to a folder with room") \
                from None
        yield Path(temporary)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def copy_to_stream(path: Path, stream: BinaryIO) -> None:
    try:
        with open(path, "rb") as source:
            shutil.copyfileobj(source, stream, _COPY_BLOCK)
        stream.flush()
    except BrokenPipeError:
        _detach_stdout()
        raise OutputError("<stdout>: the reader closed the pipe before all the audio was written") \
            from None
    except OSError as error:
        _detach_stdout()
        raise OutputError(f"<stdout>: write failed ({error.strerror or error})") from None


def _detach_stdout() -> None:
    """Point fd 1 at /dev/null: what is still buffered for stdout goes nowhere, so the
    interpreter's final flush cannot fail a second time (a traceback, exit code 120)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, sys.stdout.fileno())
        os.close(quiet)


# ------------------------------------------------------------------------ finding audio in a tree

@dataclass(frozen=True)
class Skipped:
    """A path a folder scan leaves alone on purpose, and why."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class TreeScan:
    audio: list[Path]
    other: list[Path]  # files soundfile cannot read and whose suffix does not claim audio
    skipped: list[Skipped] = field(default_factory=list)  # symlinks not followed, unreadable


def _audio_suffixes() -> set[str]:
    return {"." + name.lower() for name in sf.available_formats()} | set(_SUFFIX_ALIASES)


def scan_tree(root: Path, exclude: Path | None = None) -> TreeScan:
    """Every file under `root`, sorted, split into audio and not audio.

    A file with an audio suffix is audio even when damaged (so it is reported as a failure, not
    silently skipped); other files count as audio when soundfile can read their header. Hidden
    files and folders (temporary outputs included) and the `exclude` subtree are left out.

    The scan never leaves the tree: symlinked folders are not descended (no loops, no escape),
    and a symlinked file is used only when it resolves to a file inside `root`. Those left out,
    and folders that cannot be listed, come back in `skipped` with the reason.
    """
    suffixes = _audio_suffixes()
    audio, other, skipped = [], [], []
    top = root.resolve()
    excluded = exclude.resolve() if exclude is not None else None

    def unreadable(error: OSError) -> None:
        skipped.append(Skipped(Path(error.filename or root),
                               f"folder cannot be read ({error.strerror or error})"))

    for folder, subfolders, files in os.walk(root, onerror=unreadable):
        here = Path(folder)
        kept = []
        for name in sorted(subfolders):
            path = here / name
            if name.startswith(".") or (excluded is not None and path.resolve() == excluded):
                continue
            if path.is_symlink():
                skipped.append(Skipped(path, "symlinked folder, not followed"))
            else:
                kept.append(name)
        subfolders[:] = kept
        for file in sorted(files):
            if file.startswith("."):
                continue
            path = here / file
            problem = _link_problem(path, top)
            if problem:
                skipped.append(Skipped(path, problem))
            elif not path.is_file():  # a FIFO would block the scan forever
                skipped.append(Skipped(path, "not a regular file (a pipe, socket or device)"))
            elif path.suffix.lower() in suffixes or _readable(path):
                audio.append(path)
            else:
                other.append(path)
    return TreeScan(audio, other, skipped)


def _link_problem(path: Path, top: Path) -> str | None:
    """Why a symlink found in the tree at `top` is not followed; None for any other file."""
    if not path.is_symlink():
        return None
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):  # missing target, or a loop (RuntimeError before 3.13)
        return "broken symlink (its target is missing or a loop), not followed"
    if not target.is_relative_to(top):
        return f"symlink to {target}, outside the input folder, not followed"
    if not target.is_file():
        return "symlink to something that is not a file, not followed"
    return None


def _readable(path: Path) -> bool:
    try:
        with native_stderr_silenced():
            sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError, OSError):
        return False
    return True
