"""Warnings the kernels log once per reason (a fallback taken, a library missing)."""

from __future__ import annotations

import logging
import threading

#: One logger for the whole kernels package, as before it was split into modules.
log = logging.getLogger("speechlens_cli.kernels")

_warned: set[str] = set()
_warn_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(message)


def reset_warnings() -> None:
    """Forget which warnings were logged (tests)."""
    with _warn_lock:
        _warned.clear()
