"""Where outputs go: writable folders, never through a link inside the output folder, never an
input of the run, and atomic publication."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import OutputError, OutputExistsError, UsageError
from . import owners

#: The hidden temporary beside an output: ".NAME.<pid>-<machine>-<hex>.partial".
_TEMPORARY = re.compile(rf"\..+\.{owners.OWNER_PATTERN}-[0-9a-f]{{8}}\.partial")
#: link() errors meaning "this file system has no hard links": fall back to check-then-rename.
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV,
                  errno.ENOSYS}


def check_writable(folder: Path) -> None:
    """Prove `folder` accepts new files by creating and removing one (root ignores permissions),
    and that its device has room left (a full one still accepts an empty file)."""
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{folder}: is a file, not a folder")
    if not folder.is_dir():
        raise OutputError(f"{folder}: output folder does not exist")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise OutputError(f"{folder}: not writable ({error.strerror or error})") from None
    with contextlib.suppress(OSError):
        device = os.statvfs(folder)
        if device.f_blocks and not device.f_bavail:
            raise OutputError(f"{folder}: not writable ({os.strerror(errno.ENOSPC)})")


def nearest_existing(folder: Path) -> Path:
    """`folder` or its closest existing ancestor: where a folder still to be made would go (a
    name the system refuses, too long, is not there either)."""
    while not os.path.exists(folder) and folder.parent != folder:
        folder = folder.parent
    return folder


def name_problem(path: str | os.PathLike) -> str | None:
    """Why no file can have this name (a part of it longer than the file system takes, or the
    whole longer than the system passes), or None. Python's own checks (Path.exists, is_dir)
    raise on such a name instead of answering, so a name is checked before they see it."""
    encoded = os.fsencode(path)
    folder = nearest_existing(Path(os.fsdecode(encoded)).parent)
    path_max = _limit(folder, "PC_PATH_MAX", 4096)   # counting the terminating NUL
    if len(encoded) >= path_max:
        return (f"its name is {len(encoded):,} bytes long; the system takes at most "
                f"{path_max - 1:,}")
    name_max = _limit(folder, "PC_NAME_MAX", 255)
    longest = max(len(part) for part in encoded.split(b"/"))
    if longest > name_max:
        return (f"a part of its name is {longest:,} bytes long; the file system takes at most "
                f"{name_max:,}")
    return None


#: The characters that separate folders in a name here ("/", and Windows' "\\").
SEPARATORS = "".join(sorted({"/", os.sep, os.altsep or ""}))


def check_name_part(text: str, what: str) -> None:
    """`text` (--suffix, a report's --name) becomes part of one file's name: no folder
    separator (it would lead elsewhere), no NUL, not empty."""
    if not text or "\0" in text or any(c in text for c in SEPARATORS):
        raise UsageError(f"{what}: {text!r} must be part of a file name: not empty, no "
                         f"{' or '.join(repr(c) for c in SEPARATORS)}, no NUL")


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default


def identities(*paths: Path) -> frozenset:
    """Every name of these files: each resolved path and, where the file exists, its (device,
    inode). Two paths share one when writing one would replace the other (symlinks, "..", hard
    links): a run's inputs are gathered once, then each output is looked up in them."""
    names = set()
    for path in paths:
        with contextlib.suppress(OSError, RuntimeError):  # RuntimeError: a link loop (< 3.13)
            names.add(path.resolve())
            found = os.stat(path)
            names.add((found.st_dev, found.st_ino))
    return frozenset(names)


def same_file(a: Path, b: Path) -> bool:
    """True when writing `b` would replace `a` (symlinks, "..", hard links included)."""
    return not identities(a).isdisjoint(identities(b))


def check_no_links(root: Path, folder: Path) -> None:
    """Refuse `folder` when a folder between `root` (the output folder the user named, which,
    like its ancestors, may be a link: the user chose it) and it is a symbolic link: following
    it would write, and --overwrite replace, files outside the output tree."""
    for level in _levels(root, folder):
        try:
            mode = os.lstat(level).st_mode
        except FileNotFoundError:
            return   # the rest is still to be made, by make_folders
        except OSError as error:
            raise OutputError(f"{level}: cannot be checked ({error.strerror or error})") \
                from None
        _refuse_link(level, mode)


def make_folders(folder: Path, root: Path | None = None) -> None:
    """Create `folder` for an output: `root` (the folder the user named; default `folder`) as
    given, then each level below it one at a time, refusing a link rather than following it
    (another process may have made one since check_no_links)."""
    root = folder if root is None else root
    try:
        root.mkdir(parents=True, exist_ok=True)
        for level in _levels(root, folder):
            with contextlib.suppress(FileExistsError):
                os.mkdir(level)
            mode = os.lstat(level).st_mode
            _refuse_link(level, mode)
            if not stat.S_ISDIR(mode):
                raise OutputError(f"{level}: is a file, not a folder")
    except OSError as error:
        raise OutputError(f"{error.filename or folder}: the output folder cannot be made "
                          f"({error.strerror or error})") from None


def _levels(root: Path, folder: Path) -> list[Path]:
    """The folders from below `root` down to `folder` (which is `root` or inside it)."""
    levels, level = [], root
    for part in folder.relative_to(root).parts:
        level = level / part
        levels.append(level)
    return levels


def _refuse_link(level: Path, mode: int) -> None:
    """A link below the named output folder could lead anywhere: never written through."""
    if stat.S_ISLNK(mode):
        raise OutputError(f"{level}: is a symbolic link; speechlens does not write through "
                          "links inside the output folder")


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
    owners.sweep(folder, _TEMPORARY)   # what killed runs left here
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
    (audio/owners.py). The bytes added must still fit the file system's name limit, so a long
    NAME is cut (at a character boundary) to make room: an output whose own name fits can
    always be written."""
    suffix = f".{owners.owner()}-{secrets.token_hex(4)}.partial"
    room = _limit(folder, "PC_NAME_MAX", 255) - 1 - len(suffix.encode())
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
