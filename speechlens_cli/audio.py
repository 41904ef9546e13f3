"""Audio files with soundfile: what they hold, where outputs go, and writing them atomically."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import soundfile as sf

from .errors import AudioInputError, OutputError, UsageError

_INTEGER_SUBTYPES = ("ALAC_16", "ALAC_20", "ALAC_24", "ALAC_32")
#: Suffixes that name a soundfile container besides the format names themselves (".wav", ...).
_SUFFIX_ALIASES = {".aif": "AIFF", ".oga": "OGG", ".snd": "AU"}
#: libsndfile's log line for a WAV data chunk longer than the file: "data : 16000 (should be 7978)".
_DATA_SHORTFALL = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)
#: Data sizes that streaming writers put in a WAV header when they cannot seek back.
_STREAMED_SIZES = (0, 0xFFFFFFFF)
_OPENING = re.compile(r"^Error opening '.*?': ")
_COPY_BLOCK = 1 << 20


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


def read_info(path: str | os.PathLike, name: str | None = None) -> AudioInfo:
    """Header facts of an audio file, or the typed error that says why it cannot be enhanced."""
    path = Path(path)
    name = name or str(path)
    if path.is_dir():
        raise AudioInputError(f"{name}: is a folder, not an audio file")
    if not path.exists():
        raise AudioInputError(f"{name}: no such file")
    if path.stat().st_size == 0:
        raise AudioInputError(f"{name}: is empty (0 bytes)")
    try:
        info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError, OSError) as error:
        raise AudioInputError(f"{name}: not a readable audio file ({_reason(error)})") from None
    if info.frames <= 0:
        raise AudioInputError(f"{name}: contains no audio frames")
    if info.channels <= 0:
        raise AudioInputError(f"{name}: has no channels")
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
        if not sf.check_format(fmt, subtype):
            raise UsageError(f"subtype {subtype} cannot be written in a {fmt} file")
        return OutputFormat(fmt, subtype)
    keep = sf.check_format(fmt, info.subtype)
    return OutputFormat(fmt, info.subtype if keep else sf.default_subtype(fmt))


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
        raise OutputError(f"{destination}: already exists (use --overwrite to replace it)")
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
        try:
            os.replace(temporary, destination)
        except OSError as error:
            raise OutputError(f"{destination}: could not be written ({error.strerror or error})") \
                from None
    finally:
        if temporary is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)


@contextlib.contextmanager
def spooled_stdin(stream: BinaryIO) -> Iterator[Path]:
    """Copy a (non-seekable) input stream to a temporary file, so it can be streamed by blocks."""
    handle, temporary = tempfile.mkstemp(prefix="speechlens-stdin.", suffix=".wav")
    try:
        with os.fdopen(handle, "wb") as sink:
            shutil.copyfileobj(stream, sink, _COPY_BLOCK)
        yield Path(temporary)
    finally:
        os.unlink(temporary)


def copy_to_stream(path: Path, stream: BinaryIO) -> None:
    with open(path, "rb") as source:
        shutil.copyfileobj(source, stream, _COPY_BLOCK)
    stream.flush()


# ------------------------------------------------------------------------ finding audio in a tree

@dataclass(frozen=True)
class TreeScan:
    audio: list[Path]
    other: list[Path]  # files soundfile cannot read and whose suffix does not claim audio


def _audio_suffixes() -> set[str]:
    return {"." + name.lower() for name in sf.available_formats()} | set(_SUFFIX_ALIASES)


def scan_tree(root: Path, exclude: Path | None = None) -> TreeScan:
    """Every file under `root`, sorted, split into audio and not audio.

    A file with an audio suffix is audio even when damaged (so it is reported as a failure, not
    silently skipped); other files count as audio when soundfile can read their header. Hidden
    files and folders (temporary outputs included) and the `exclude` subtree are left out.
    """
    suffixes = _audio_suffixes()
    audio, other = [], []
    excluded = exclude.resolve() if exclude is not None else None
    for folder, subfolders, files in os.walk(root):
        here = Path(folder)
        subfolders[:] = sorted(
            d for d in subfolders
            if not d.startswith(".") and (excluded is None or (here / d).resolve() != excluded)
        )
        for file in sorted(files):
            if file.startswith("."):
                continue
            path = here / file
            if path.suffix.lower() in suffixes or _readable(path):
                audio.append(path)
            else:
                other.append(path)
    return TreeScan(audio, other)


def _readable(path: Path) -> bool:
    try:
        sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError, OSError):
        return False
    return True
