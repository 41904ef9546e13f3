"""Scale-out: one batch split over processes, GPUs or hosts (docs/scale-out.md).

Two ways to split a batch, one plan:

* A group started by MLX's own launcher (`mlx.launch`: the ring backend over TCP on CPUs and
  Macs, NCCL on CUDA hosts, JACCL over Thunderbolt RDMA; or `mpirun` for MPI). Every rank
  computes the same plan from the same file list, enhances only its share, and the per-file
  results are gathered with `mx.distributed.all_gather` so that rank 0 prints one report.
* `--shard I/N`: the same split without a launcher, for any scheduler (SLURM arrays, GNU
  parallel, Ray). Shards never talk to each other; each reports and exits on its own.

The plan balances audio duration: files (read from their headers) go largest first onto the
least-loaded part, equal durations in path order, equal loads to the lower part, so every
process computes the same plan without communicating. Outputs that would collide stay together.
With --skip-existing the plan is still made over the full list (shares stay stable across
re-runs) and each part skips inside its share.

In a group every rank exits with the combined code (0 all done, 3 some files failed, 1 a rank
stopped), after rank 0 has printed the whole report and all ranks have met at a final barrier
(the package raises GroupExit; the CLI prints its line and exits, cli/app.py):
`mlx.launch` terminates the remaining ranks as soon as one exits with a non-zero code, so nothing
may still be printing by then. (`mlx.launch` itself exits 0 whatever its ranks return; it logs
"Node with rank R exited with code C".)

Modules: ``plan`` (who does which file), ``launcher`` (joining the group a launcher started),
``collectives`` (talking to the group) and ``share`` (this process's part of a batch, run alone
or in a group).
"""

from __future__ import annotations

from .launcher import join, launched_backend
from .plan import assign, file_seconds, parse_shard
from .share import Share

__all__ = ["Share", "assign", "file_seconds", "join", "launched_backend", "parse_shard"]
