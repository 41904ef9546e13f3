"""Joining the group that MLX's launcher (or mpirun) started this process in."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

import mlx.core as mx

from .. import settings
from ..errors import SpeechlensError, UsageError
from .collectives import Collectives
from .share import Share

#: Seconds a rank waits for its group to form; MLX's ring backend otherwise waits forever for
#: peers that never come (launcher variables left in a shell), holding the interpreter.
JOIN_TIMEOUT_ENV = settings.JOIN_TIMEOUT_S.name
#: mlx.launch's hostfile lists a few hosts; more than this is not one.
MAX_HOSTFILE_BYTES = 1 << 20


def _in_group(rank: int | None, size: int | None) -> bool:
    """A group of more than one process, and a rank that names one of them."""
    return size is not None and size > 1 and rank is not None and rank < size


def _ring_size(hostfile: Path) -> int:
    """Processes the ring hostfile lists (0: missing, blank, unreadable or not a list of hosts,
    a hostfile left behind). Anything but a regular file of at most 1 MiB is a usage error:
    reading a FIFO would wait for a writer forever, and /dev/zero never ends."""
    try:
        data = _hostfile_bytes(hostfile)
    except OSError:
        return 0
    if data is None:
        raise UsageError(f"MLX_HOSTFILE={hostfile}: not a hostfile (mlx.launch writes a JSON "
                         "list of hosts, a regular file of at most 1 MiB); unset MLX_RANK and "
                         "MLX_HOSTFILE to run alone")
    try:
        hosts = json.loads(data) if data.strip() else []
    except ValueError:
        return 0
    return len(hosts) if isinstance(hosts, list) else 0


def _hostfile_bytes(hostfile: Path) -> bytes | None:
    """The file's bytes; None for anything but a regular file of at most MAX_HOSTFILE_BYTES,
    which is never opened for a blocking read."""
    if not stat.S_ISREG(os.stat(hostfile).st_mode):
        return None
    descriptor = os.open(hostfile, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO put there meanwhile
    with open(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        data = handle.read(MAX_HOSTFILE_BYTES + 1)
    return data if len(data) <= MAX_HOSTFILE_BYTES else None


def launched_backend(env: Mapping[str, str] | None = None) -> str | None:
    """The mx.distributed backend a launcher started this process for, or None when alone.

    Only a launcher's full, consistent set counts, so that variables left in a shell never
    stop or hang a single-process run: mlx.launch's MLX_RANK with MLX_HOSTFILE listing more
    than one host and the rank among them (ring), with NCCL_HOST_IP and MLX_WORLD_SIZE above 1
    (nccl), or with MLX_IBV_DEVICES (jaccl); mpirun's OMPI_COMM_WORLD_SIZE or PMI_SIZE above 1
    together with the rank variable of the same launcher, in range. `mlx.launch -n 1` writes
    an empty hostfile: that is one process, not a group.
    """
    rank = settings.MLX_RANK.value(env)
    if settings.MLX_RANK.is_set(env) or settings.JACCL_RANK.is_set(env):
        if settings.NCCL_HOST_IP.value(env):
            return "nccl" if _in_group(rank, settings.MLX_WORLD_SIZE.value(env)) else None
        if settings.MLX_IBV_DEVICES.value(env) or settings.JACCL_IBV_DEVICES.value(env):
            return "jaccl"
        hostfile = settings.MLX_HOSTFILE.value(env)
        if hostfile:
            return "ring" if _in_group(rank, _ring_size(hostfile)) else None
    for size, group_rank in ((settings.OMPI_SIZE, settings.OMPI_RANK),
                             (settings.PMI_SIZE, settings.PMI_RANK)):
        if _in_group(group_rank.value(env), size.value(env)):
            return "mpi"
    return None


@contextlib.contextmanager
def _bounded_join(backend: str, seconds: float) -> Iterator[None]:
    """mx.distributed.init waits for every peer inside MLX, holding the interpreter: no Python
    timer or signal handler runs until it returns. A forked watcher (its own process, no shared
    interpreter) ends this one with one line if the group has not formed in `seconds`."""
    done_read, done_write = os.pipe()
    parent = os.getpid()
    watcher = os.fork()
    if watcher == 0:   # the watcher: only system calls from here on, and never back up
        try:
            os.close(done_write)
            ready, _, _ = select.select([done_read], [], [], seconds)
            if not ready:
                os.write(2, (f"error: the {backend} group did not form within {seconds:g} s "
                             "(not every peer joined): launcher variables left in this shell? "
                             "Unset MLX_RANK and MLX_HOSTFILE to run alone, or raise "
                             f"{JOIN_TIMEOUT_ENV}\n").encode())
                os.kill(parent, signal.SIGKILL)
        finally:
            os._exit(0)
    os.close(done_read)
    try:
        yield
    finally:
        os.close(done_write)
        os.waitpid(watcher, 0)


def join(shard: tuple[int, int] | None, env: Mapping[str, str] | None = None) -> Share:
    """This process's Share: --shard's part, a launcher's group, or the whole batch. The
    launcher's settings are checked first, also for a run alone."""
    seconds = settings.JOIN_TIMEOUT_S.value(env)
    backend = launched_backend(env)
    if shard is not None:
        if backend in ("ring", "nccl", "jaccl"):
            raise UsageError("--shard splits the batch itself: do not also start it with "
                             "mlx.launch (use one or the other)")
        return Share(*shard)
    if backend is None:
        return Share()
    if not mx.distributed.is_available(backend):
        raise SpeechlensError(
            f"started by a launcher for MLX's {backend} backend, which this MLX build does not "
            "have; use mlx.launch --backend ring, or --shard I/N")
    try:
        with _bounded_join(backend, seconds):
            group = mx.distributed.init(strict=True, backend=backend)
    except RuntimeError as error:
        raise SpeechlensError(f"could not join the {backend} group the launcher started "
                              f"({error})") from None
    if group.size() == 1:
        return Share()
    return Share(group.rank(), group.size(), Collectives(group, backend))
