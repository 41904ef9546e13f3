"""Many planned files through the model, with their reading and writing beside it.

The model runs on the calling thread, and MLX lets go of the GIL while it evaluates; so one
worker thread reads and decodes the windows ahead of the model, and another joins, encodes,
writes, reads back and publishes the finished ones, while the model works on the next. The
queues between them are bounded (READ_AHEAD windows ahead of the model, WRITE_BEHIND behind it),
so a corpus of any size holds a few windows of host memory. Each file's outcome comes back in
the order of the files. A file that fails (unreadable, changed since planning, the model's
error, a full disk) fails alone; stopping (an interrupt, a failure that is not a file's) ends
both workers, which remove what they had half-written, before it returns.

Every step is the one-thread pipeline's (pipeline.read_windows, checked_output, WindowJoiner),
so a file's output is the same whether it runs alone or among others.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from . import audio as audio_io
from .errors import SpeechlensError
from .pipeline import (
    Geometry,
    ProgressFn,
    StreamResult,
    WindowFn,
    WindowJoiner,
    bounded_cache,
    checked_output,
    read_windows,
)

if TYPE_CHECKING:
    from .api import FilePlan

#: Windows read ahead of the model: with one file a window, the next two files are decoded
#: while the model runs this one.
READ_AHEAD = 2
#: Enhanced windows waiting for the writer before the model waits for it.
WRITE_BEHIND = 2
#: How often a waiting thread looks whether the run is stopping (seconds).
_POLL_S = 0.05


@dataclass(frozen=True)
class Work:
    """One file for the conveyor: its plan, its windows, and the model's function for them."""

    plan: FilePlan
    geometry: Geometry
    enhance_window: WindowFn
    atten_lim_db: float | None = None


@dataclass(frozen=True)
class Finished:
    """A file written whole and published."""

    stream: StreamResult
    #: From its first window reaching the model to its output published.
    elapsed_seconds: float


@dataclass(frozen=True)
class _Crash:
    """A failure that is not a file's (a bug): raised again on the model's thread."""

    error: BaseException


class Conveyor:
    """Runs `items` in order: each Work is enhanced into its output, anything else passes
    through as its own outcome. Iterating gives one outcome per item, in order: the item passed
    through, `finish(work, Finished)` (on the writer's thread; default: the Finished), or the
    file's SpeechlensError. `on_start(work)`, called on this thread as a file's first window
    reaches the model, may return the file's progress callback (frames enhanced so far; an
    exception it raises, an interrupt, stops the run).

    Use it in a `with` block: leaving it stops both workers and removes their half-written
    outputs. After an interrupt, `stop()` also gives the outcomes finished meanwhile, in order
    (files published while the model was on a later one), for the caller to report."""

    def __init__(self, items: Sequence[Any], *,
                 on_start: Callable[[Work], ProgressFn | None] | None = None,
                 finish: Callable[[Work, Finished], Any] | None = None):
        self.items = list(items)
        self.on_start = on_start or (lambda work: None)
        self.finish = finish or (lambda work, finished: finished)
        self._reads: queue.Queue = queue.Queue(READ_AHEAD)
        self._writes: queue.Queue = queue.Queue(WRITE_BEHIND)
        self._outcomes: queue.Queue = queue.Queue()   # (index, outcome) from the writer
        self._stopping = threading.Event()
        #: Files the writer gave up (a full disk, or failed before it): the model skips the rest
        #: of their windows.
        self._abandoned: set[int] = set()
        self._ready: dict[int, Any] = {i: item for i, item in enumerate(self.items)
                                       if not isinstance(item, Work)}
        self._next = 0   # the next item to hand out
        self._threads = [threading.Thread(target=target, name=f"speechlens-{name}", daemon=True)
                         for name, target in (("reader", self._read), ("writer", self._write))]
        self._run: Iterator[Any] | None = None

    def __enter__(self) -> Conveyor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # --------------------------------------------------------------------- the model's thread

    def __iter__(self) -> Iterator[Any]:
        if self._run is None:
            self._run = self._outcomes_in_order()
        return self._run

    def _outcomes_in_order(self) -> Iterator[Any]:
        for thread in self._threads:
            thread.start()
        reading = any(isinstance(item, Work) for item in self.items)
        failed: set[int] = set()     # files the model's thread stopped (their rest is dropped)
        current = None               # (index, its progress callback, when it started)
        with bounded_cache():
            while self._next < len(self.items):
                self._collect(block=False)
                if self._next in self._ready:
                    outcome = self._ready.pop(self._next)
                    self._next += 1
                    yield outcome
                    continue
                if not reading:
                    self._collect(block=True)
                    continue
                message = self._reads.get()
                kind, index = message[0], message[1]
                if kind == "read all":
                    reading = False
                elif kind == "crash":
                    raise message[2]
                elif index in failed or index in self._abandoned:
                    continue
                elif kind == "error":
                    failed.add(index)
                    self._to_writer(message)
                elif kind == "end":
                    self._to_writer(message)
                else:   # a window
                    _, index, start, end, window = message
                    work = self.items[index]
                    if current is None or current[0] != index:
                        current = (index, self.on_start(work), time.monotonic())
                    rate, name = work.plan.info.sample_rate, work.plan.name
                    try:
                        enhanced = checked_output(window, work.enhance_window(window), start,
                                                  rate, name)
                    except SpeechlensError as error:
                        failed.add(index)
                        self._to_writer(("error", index, error))
                        continue
                    self._to_writer(("window", index, start, end, window, enhanced, current[2]))
                    if current[1] is not None:
                        current[1](work.geometry.settled(end, work.plan.info.frames))

    def _to_writer(self, message: tuple) -> None:
        """Queue a message for the writer, waiting while WRITE_BEHIND are queued (a writer that
        crashed meanwhile is raised here rather than waited for)."""
        while True:
            try:
                self._writes.put(message, timeout=_POLL_S)
                return
            except queue.Full:
                self._collect(block=False)

    def _collect(self, *, block: bool) -> None:
        """Take the writer's outcomes (waiting for one if `block`); a crash is raised here."""
        while True:
            try:
                index, outcome = self._outcomes.get() if block else self._outcomes.get_nowait()
            except queue.Empty:
                return
            if isinstance(outcome, _Crash):
                raise outcome.error
            self._ready[index] = outcome
            block = False

    def stop(self) -> list[Any]:
        """End both workers (the writer removes the output it was writing), then the outcomes
        that finished but were not handed out yet, in order up to the first that did not."""
        self._stopping.set()
        if self._run is not None:
            self._run.close()   # its MLX cache limit restored (pipeline.bounded_cache)
            reader, writer = self._threads
            while reader.is_alive():     # it may wait to put a window: make room
                with contextlib.suppress(queue.Empty):
                    self._reads.get(timeout=_POLL_S)
            while writer.is_alive():     # it looks at the flag at every message
                with contextlib.suppress(queue.Full):
                    self._writes.put(("stop", -1), timeout=_POLL_S)
        finished = []
        with contextlib.suppress(BaseException):
            self._collect(block=False)
        while self._next in self._ready and not isinstance(self._ready[self._next], _Crash):
            finished.append(self._ready.pop(self._next))
            self._next += 1
        return finished

    # --------------------------------------------------------------------------- the workers

    def _put(self, message: tuple) -> bool:
        """Hand the model's thread a message; False if the run stops meanwhile."""
        while not self._stopping.is_set():
            with contextlib.suppress(queue.Full):
                self._reads.put(message, timeout=_POLL_S)
                return True
        return False

    def _read(self) -> None:
        """Every file's windows in order, then "read all"; a file that cannot be read is its
        "error" and the next one is read."""
        try:
            for index, work in enumerate(self.items):
                if not isinstance(work, Work):
                    continue
                plan = work.plan
                try:
                    with audio_io.open_reader(plan.source, plan.name, plan.info) as (handle, info):
                        for start, end, window in read_windows(handle, info, work.geometry,
                                                               plan.name):
                            if not self._put(("window", index, start, end, window)):
                                return
                except SpeechlensError as error:
                    if not self._put(("error", index, error)):
                        return
                    continue
                if not self._put(("end", index)):
                    return
            self._put(("read all", -1))
        except BaseException as error:   # a bug: the model's thread raises it
            self._put(("crash", -1, error))

    def _write(self) -> None:
        """Each file's windows into its temporary outputs, published at its "end"; an "error"
        (the reader's, the model's) or a failure here abandons it, and its outcome is the
        error."""
        writing: _Writing | None = None
        try:
            while True:
                message = self._writes.get()
                if self._stopping.is_set() or message[0] == "stop":
                    return
                kind, index = message[0], message[1]
                if index in self._abandoned:
                    continue
                try:
                    if kind == "window":
                        _, _, start, end, window, enhanced, started = message
                        if writing is None:
                            writing = _Writing(self.items[index], started)
                        writing.add(start, end, window, enhanced)
                    elif kind == "end":
                        finished, writing = writing, None
                        self._outcomes.put(
                            (index, self.finish(self.items[index], finished.publish())))
                    else:   # "error"
                        raise message[2]
                except SpeechlensError as error:
                    self._abandoned.add(index)
                    if writing is not None:
                        writing.abandon(error)
                        writing = None
                    self._outcomes.put((index, error))
        except BaseException as error:   # a bug: the model's thread raises it
            self._outcomes.put((-1, _Crash(error)))
        finally:
            if writing is not None:
                writing.abandon(InterruptedError("the run stopped"))


class _Writing:
    """One file being written: its temporary output (and residual), which only publish()
    renames into place; abandon() removes them."""

    def __init__(self, work: Work, started: float):
        plan, self.started = work.plan, started
        self.geometry = work.geometry
        self.outputs = contextlib.ExitStack()
        try:
            audio_io.make_folders(plan.destination.parent, plan.root)
            residual = plan.residual  # in the output's folder or one that exists (plan_residual)
            if residual is not None:  # published after the output, each whole or not at all
                residual = replace(residual, destination=self.outputs.enter_context(
                    audio_io.atomic_output(residual.destination, overwrite=plan.overwrite)))
            temporary = self.outputs.enter_context(
                audio_io.atomic_output(plan.destination, overwrite=plan.overwrite))
            self.joiner = WindowJoiner(temporary, plan.info, plan.output, str(plan.destination),
                                       residual=residual, atten_lim_db=work.atten_lim_db)
        except BaseException as error:
            self.outputs.__exit__(type(error), error, error.__traceback__)
            raise

    def add(self, start: int, end: int, window, enhanced) -> None:
        self.joiner.add(start, end, self.geometry, window, enhanced)

    def publish(self) -> Finished:
        """Close and read back the outputs, then rename them into place."""
        try:
            stream = self.joiner.close()
        except BaseException as error:
            self.outputs.__exit__(type(error), error, error.__traceback__)
            raise
        self.outputs.close()
        return Finished(stream, time.monotonic() - self.started)

    def abandon(self, error: BaseException) -> None:
        self.joiner.abandon()
        self.outputs.__exit__(type(error), error, error.__traceback__)
