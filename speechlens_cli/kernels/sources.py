"""Where the kernel sources are (read once each), and where compiled kernels are cached."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

from .. import settings
from . import build

_PACKAGE = Path(__file__).resolve().parents[1]  # speechlens_cli/


def kernel_source_dir() -> Path:
    """Folder holding the kernel sources: the wheel's ``speechlens_cli/kernel_src`` or the
    checkout's ``kernels/`` (editable install), unless ``SPEECHLENS_KERNEL_DIR`` is set."""
    override = settings.KERNEL_DIR.value()
    candidates = ([override] if override
                  else [_PACKAGE / "kernel_src", _PACKAGE.parent / "kernels"])
    for folder in candidates:
        if (folder / "sl_mamba.h").is_file():
            return folder
    raise FileNotFoundError(
        "speechlens kernel sources not found (looked in "
        + ", ".join(str(c) for c in candidates) + "); reinstall speechlens"
    )


@functools.cache
def source(name: str) -> str:
    return (kernel_source_dir() / name).read_text(encoding="utf-8")


def cpu_sources_hash() -> str:
    """The hash a CPU library built from the sources found here must carry."""
    return build.sources_hash(kernel_source_dir())


def cache_dir() -> Path:
    """Where kernels compiled at run time are kept: ``SPEECHLENS_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/speechlens``, else ``~/.cache/speechlens``."""
    root = settings.CACHE_DIR.value()
    if root:
        return root
    xdg = settings.XDG_CACHE_HOME.value()
    return (xdg if xdg else Path.home() / ".cache") / "speechlens"


def store_in_cache(path: Path, data: bytes) -> None:
    """Write `data` to `path` in the cache folder whole or not at all (a temporary file beside
    it, then os.replace, so a reader or another writer never sees a part). A cache that cannot
    be written is left as it is: it costs the next process the work again, nothing more."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
