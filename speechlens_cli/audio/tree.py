"""Finding the audio files in a folder tree, without ever leaving it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .formats import audio_suffixes
from .read import readable


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


def scan_tree(root: Path, exclude: Path | None = None) -> TreeScan:
    """Every file under `root`, sorted, split into audio and not audio.

    A file with an audio suffix is audio even when damaged (so it is reported as a failure, not
    silently skipped); other files count as audio when soundfile can read their header. Hidden
    files and folders (temporary outputs included) and the `exclude` subtree are left out.

    The scan never leaves the tree: symlinked folders are not descended (no loops, no escape),
    and a symlinked file is used only when it resolves to a file inside `root`. Those left out,
    folders that cannot be listed and paths the system refuses (longer than it takes) come back
    in `skipped` with the reason: one such path never stops the scan of the rest.
    """
    suffixes = audio_suffixes()
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
            try:
                if name.startswith(".") or (excluded is not None and path.resolve() == excluded):
                    continue
                if path.is_symlink():
                    skipped.append(Skipped(path, "symlinked folder, not followed"))
                else:
                    kept.append(name)
            except OSError as error:   # a path longer than the system takes, deep in the tree
                skipped.append(Skipped(path, f"folder cannot be read ({error.strerror})"))
        subfolders[:] = kept
        for file in sorted(files):
            if file.startswith("."):
                continue
            path = here / file
            try:
                problem = _link_problem(path, top)
                regular = problem is None and path.is_file()
                is_audio = regular and (path.suffix.lower() in suffixes or readable(path))
            except OSError as error:   # a path longer than the system takes, deep in the tree
                skipped.append(Skipped(path, f"cannot be read ({error.strerror})"))
                continue
            if problem:
                skipped.append(Skipped(path, problem))
            elif not regular:  # a FIFO would block the scan forever
                skipped.append(Skipped(path, "not a regular file (a pipe, socket or device)"))
            else:
                (audio if is_audio else other).append(path)
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
