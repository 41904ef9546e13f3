"""Where an output may go, checked before anything is written: a name the system takes, a
writable folder with room, never through a link inside the output folder, never an input of the
run (by any of its names), and the folders below the output folder made one level at a time."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from ...errors import OutputError, UsageError


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
    path_max = name_limit(folder, "PC_PATH_MAX", 4096)   # counting the terminating NUL
    if len(encoded) >= path_max:
        return (f"its name is {len(encoded):,} bytes long; the system takes at most "
                f"{path_max - 1:,}")
    name_max = name_limit(folder, "PC_NAME_MAX", 255)
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


def name_limit(folder: Path, name: str, default: int) -> int:
    """The file system's limit `name` (os.pathconf's PC_NAME_MAX, PC_PATH_MAX) at `folder`."""
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
