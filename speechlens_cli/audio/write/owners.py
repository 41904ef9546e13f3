"""Temporary files named after the process that owns them, so that a later run can remove those
a dead process left behind (kill -9, a crash, a power cut): signals that can be caught are
cleaned up by their handlers, these cannot. The names of every such temporary are here: an
output's beside it, stdin's copy and stdout's folder in TMPDIR.

A name carries `<pid>-<machine>`: the owner's process id and a tag of the machine and process
namespace it runs in (host name, boot, PID namespace). A file is removed only when its tag is this
process's own tag and no process of that id exists; a tag from elsewhere (another host sharing
the folder, another container), a live owner, or a name of any other shape is never touched.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

#: What the owner part of a name looks like, for the patterns of the callers.
OWNER_PATTERN = r"(?P<pid>\d{1,10})-(?P<machine>[0-9a-f]{6})"
#: The hidden temporary beside an output: ".NAME.<pid>-<machine>-<hex>.partial".
TEMPORARY = re.compile(rf"\..+\.{OWNER_PATTERN}-[0-9a-f]{{8}}\.partial")
SPOOL_PREFIX, SPOOL_SUFFIX = "speechlens-stdin.", ".stdin"
#: The stdin copy in TMPDIR: "speechlens-stdin.<pid>-<machine>-<random>.stdin" (.wav before).
_SPOOL = re.compile(rf"{re.escape(SPOOL_PREFIX)}{OWNER_PATTERN}-\w+\.(stdin|wav)")
STDOUT_PREFIX = "speechlens-stdout."
#: The folder in TMPDIR where the output for stdout is made: "speechlens-stdout.<owner>-<random>".
_STDOUT_FOLDER = re.compile(rf"{re.escape(STDOUT_PREFIX)}{OWNER_PATTERN}-\w+")
_swept: set[tuple[str, str]] = set()


@functools.cache
def _machine() -> str:
    """Six hex digits naming this host, its current boot and this PID namespace: a process id
    means the same process only where all three agree."""
    parts = [socket.gethostname()]
    for source in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        with contextlib.suppress(OSError):
            parts.append(Path(source).read_text().strip() if "boot" in source
                         else os.readlink(source))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:6]


def owner() -> str:
    """This process's owner part: `<pid>-<machine>`."""
    return f"{os.getpid()}-{_machine()}"


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, OSError):
        return False   # alive under another user, or not a process id we can judge
    return False


def sweep(folder: str | os.PathLike, pattern: re.Pattern[str], *,
          folders: bool = False) -> list[str]:
    """Remove the files (with `folders`, the folders instead) in `folder` whose names match
    `pattern` (with OWNER_PATTERN's groups) and whose owner was a process of this machine that
    no longer exists; once per folder and pattern in a process. Returns the names removed.
    Failures are ignored: it is housekeeping."""
    key = (os.path.abspath(folder), pattern.pattern)
    if key in _swept:
        return []
    _swept.add(key)
    removed = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            match = pattern.fullmatch(entry.name)
            kind = entry.is_dir if folders else entry.is_file
            if (match is None or match["machine"] != _machine() or not _dead(int(match["pid"]))
                    or not kind(follow_symlinks=False)):
                continue
            with contextlib.suppress(OSError):
                if folders:
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(entry.name)
    return removed


def sweep_tmpdir() -> None:
    """What killed runs left in TMPDIR: copies of stdin, folders of stdout outputs (a run that
    uses either removes both)."""
    sweep(tempfile.gettempdir(), _SPOOL)
    sweep(tempfile.gettempdir(), _STDOUT_FOLDER, folders=True)
