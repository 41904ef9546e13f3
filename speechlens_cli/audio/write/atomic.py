"""Atomic outputs: each is written under a hidden temporary name beside its destination and
given its name only once finished and on the disk, so a destination holds a whole file or what
it held before; --overwrite decides whether an existing file may be replaced, and only a file
(or a link) ever is."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from ...errors import OutputError, OutputExistsError
from . import owners
from .places import name_limit

#: link() errors meaning "this file system has no hard links": fall back to check-then-rename.
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV,
                  errno.ENOSYS}


@contextlib.contextmanager
def atomic_output(destination: str | os.PathLike, *, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary path beside `destination`; rename it into place only on success.

    The temporary file is removed on any failure, Ctrl-C included.
    """
    destination = Path(destination)
    _check_replaceable(destination, overwrite=overwrite)
    folder = destination.parent
    if not folder.is_dir():
        raise OutputError(f"{folder}: output folder does not exist")
    owners.sweep(folder, owners.TEMPORARY)   # what killed runs left here
    temporary = None
    try:
        # The name is recorded before the file exists, so an interrupt at any point after
        # creation still finds it to remove.
        while temporary is None:
            temporary = folder / _temporary_name(folder, destination.name)
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


def _temporary_name(folder: Path, name: str) -> str:
    """A hidden ".NAME.<pid>-<machine>-<hex>.partial" beside the output, its owner in its name
    (owners.py). The bytes added must still fit the file system's name limit, so a long
    NAME is cut (at a character boundary) to make room: an output whose own name fits can
    always be written."""
    suffix = f".{owners.owner()}-{secrets.token_hex(4)}.partial"
    room = name_limit(folder, "PC_NAME_MAX", 255) - 1 - len(suffix.encode())
    encoded = os.fsencode(name)
    if len(encoded) > room:
        cut = encoded[:room]
        if _is_utf8(encoded):  # never split a character
            cut = cut.decode("utf-8", "ignore").encode()
        name = os.fsdecode(cut)
    return f".{name}{suffix}"


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _check_replaceable(destination: Path, *, overwrite: bool) -> None:
    """Only a regular file (or a link, itself replaced) may stand where the output goes: a FIFO
    or a device node would be swapped for a file, and its reader or the device left behind."""
    try:
        mode = os.lstat(destination).st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise OutputError(f"{destination}: cannot be checked ({error.strerror or error})") \
            from None
    if stat.S_ISLNK(mode) and not destination.exists():
        if not overwrite:
            raise OutputExistsError(f"{destination}: is a symbolic link to a missing file "
                                    "(remove it, or use --overwrite to replace the link)")
        return
    if stat.S_ISLNK(mode):
        mode = os.stat(destination).st_mode
    kind = ("a folder" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else None)
    if kind:
        raise OutputError(f"{destination}: is {kind}, not a file; speechlens replaces only "
                          "files (to stream, write to - for standard output)")
    if not overwrite:
        raise OutputExistsError(f"{destination}: already exists (use --overwrite to replace it)")


def _publish(temporary: Path, destination: Path, *, overwrite: bool) -> None:
    """Give the finished temporary file its final name, its data on the disk first and the
    name after it: a crash or power cut then never leaves the name on a file whose data was
    lost (and a write some file systems, NFS among them, report failed only at fsync fails here).

    Without `overwrite` an existing file is never replaced, not even one another process created
    while this one was enhancing: a hard link fails when the name is taken (the caller removes
    the temporary name). File systems without hard links get a check, then a rename.
    """
    try:
        _sync(temporary)
        _place(temporary, destination, overwrite=overwrite)
    except OSError as error:
        if not destination.parent.is_dir():
            raise OutputError(
                f"{destination}: its folder was removed while the file was being written"
            ) from None
        raise OutputError(f"{destination}: could not be written ({error.strerror or error})") \
            from None
    try:
        _sync(destination.parent, folder=True)
    except OSError as error:
        raise OutputError(f"{destination}: written, but its folder could not be flushed to the "
                          f"disk ({error.strerror or error}): a crash may still lose the name") \
            from None


def _place(temporary: Path, destination: Path, *, overwrite: bool) -> None:
    """Rename the temporary into place (`overwrite`), else link it, which never clobbers."""
    if overwrite:
        os.replace(temporary, destination)
        return
    try:
        os.link(temporary, destination)
    except FileExistsError:
        raise OutputExistsError(
            f"{destination}: already exists (created by another process meanwhile; "
            "use --overwrite to replace it)"
        ) from None
    except OSError as error:
        if error.errno not in _NO_HARD_LINKS:
            raise
    else:
        # The temporary name goes at once, before the folder is flushed (which then records
        # both): a process killed after this leaves no stray copy of a finished file.
        with contextlib.suppress(OSError):  # the caller removes it otherwise
            os.unlink(temporary)
        return
    if destination.exists():
        raise OutputExistsError(
            f"{destination}: already exists (use --overwrite to replace it)")
    os.replace(temporary, destination)


def _sync(path: Path, *, folder: bool = False) -> None:
    """fsync a file, or a folder (its entries); a file system that cannot sync a folder says
    EINVAL, which leaves it at that."""
    handle = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if folder else 0))
    try:
        os.fsync(handle)
    except OSError as error:
        if not (folder and error.errno == errno.EINVAL):
            raise
    finally:
        os.close(handle)
