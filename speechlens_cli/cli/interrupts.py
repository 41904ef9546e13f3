"""Signals during a batch: each terminating one interrupts like Ctrl-C (temporary output
removed; exit 128 + the signal's number, as a shell reports it: 130 for Ctrl-C, 143 for SIGTERM),
once, and the interrupt cannot be lost."""

from __future__ import annotations

import contextlib
import signal
import threading

#: Signals whose default action ends the process: each cleans up like Ctrl-C (temporary output
#: removed, exit 128 + its number). SIGHUP is a closed terminal or a dropped ssh session.
TERMINATING_SIGNALS = tuple(getattr(signal, name) for name in (
    "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF",
    "SIGXCPU") if hasattr(signal, name))
_INTERRUPTING = (signal.SIGINT, *TERMINATING_SIGNALS)
#: The number of the signal that interrupted the batch (0: none yet).
_interrupted = 0


class BatchInterrupted(KeyboardInterrupt):
    """An interrupted batch, saying how far it got and how to go on."""

    def __init__(self, done: int, total: int):
        super().__init__(f"interrupted (no partial output left behind): {done} of {total} "
                         "done; resume with --skip-existing")


def exit_code() -> int:
    """128 + the interrupting signal's number, the shells' convention (Ctrl-C: 130)."""
    return 128 + (_interrupted or signal.SIGINT)


def _raise_interrupt(signum, _frame) -> None:
    """The first signal interrupts; later ones (a Ctrl-C burst) are ignored, so they cannot
    break the clean-up it starts or surface as "Exception ignored ... KeyboardInterrupt"."""
    global _interrupted
    _interrupted = signum
    for number in _INTERRUPTING:
        signal.signal(number, signal.SIG_IGN)
    raise KeyboardInterrupt


@contextlib.contextmanager
def signals_interrupt():
    """Every catchable terminating signal interrupts like Ctrl-C while the batch runs, except
    one this process was started ignoring (`nohup` ignores SIGHUP; a background job, SIGINT)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    try:
        for number in _INTERRUPTING:
            if signal.getsignal(number) is not signal.SIG_IGN:
                previous[number] = signal.signal(number, _raise_interrupt)
        yield
    finally:
        if not _interrupted:  # after an interrupt, later signals stay ignored to the end
            for number, handler in previous.items():
                signal.signal(number, handler)


def check() -> None:
    """Raise KeyboardInterrupt again if a signal already interrupted the batch.

    The handler raises where the main thread happens to be; code that clears the error it finds
    there (a C extension's callback, a finalizer) would lose it, and with every later signal
    ignored the run would finish as if never interrupted. The batch calls this between windows
    and files, so the interrupt takes effect at the next one whatever swallowed it."""
    if _interrupted:
        raise KeyboardInterrupt


def checked(progress):
    """`progress` (a pipeline progress callback) that first checks for an interrupt."""
    def update(frames: int) -> None:
        check()
        progress(frames)
    return update
