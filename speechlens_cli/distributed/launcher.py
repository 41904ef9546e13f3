"""Joining the group that MLX's launcher (or mpirun) started this process in."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import mlx.core as mx

from ..errors import SpeechlensError, UsageError
from .collectives import Collectives
from .share import Share


def _integer(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def launched_backend(env: Mapping[str, str] | None = None) -> str | None:
    """The mx.distributed backend a launcher started this process for, or None when alone.

    mlx.launch sets MLX_RANK plus MLX_HOSTFILE (ring), NCCL_HOST_IP and MLX_WORLD_SIZE (nccl) or
    MLX_IBV_DEVICES (jaccl); mpirun sets OMPI_COMM_WORLD_SIZE or PMI_SIZE. `mlx.launch -n 1`
    writes an empty hostfile: that is one process, not a group.
    """
    env = os.environ if env is None else env
    if "MLX_RANK" in env or "JACCL_RANK" in env:
        if env.get("NCCL_HOST_IP"):
            return "nccl" if _integer(env.get("MLX_WORLD_SIZE")) > 1 else None
        if env.get("MLX_IBV_DEVICES") or env.get("JACCL_IBV_DEVICES"):
            return "jaccl"
        if env.get("MLX_HOSTFILE"):
            hostfile = Path(env["MLX_HOSTFILE"])
            try:
                blank = hostfile.is_file() and not hostfile.read_text().strip()
            except OSError:
                blank = False
            return None if blank else "ring"
    if max(_integer(env.get("OMPI_COMM_WORLD_SIZE")), _integer(env.get("PMI_SIZE"))) > 1:
        return "mpi"
    return None


def join(shard: tuple[int, int] | None, env: Mapping[str, str] | None = None) -> Share:
    """This process's Share: --shard's part, a launcher's group, or the whole batch."""
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
        group = mx.distributed.init(strict=True, backend=backend)
    except RuntimeError as error:
        raise SpeechlensError(f"could not join the {backend} group the launcher started "
                              f"({error})") from None
    if group.size() == 1:
        return Share()
    return Share(group.rank(), group.size(), Collectives(group, backend))
