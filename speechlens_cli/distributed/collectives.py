"""Talking to the group: gathering bytes from every rank, and meeting at a barrier."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from ..errors import SpeechlensError

#: Per launcher backend, where the collectives run (NCCL needs a CUDA stream).
_GPU_BACKENDS = ("nccl",)


class Collectives:
    """mx.distributed calls on one group, with the failure of another rank as a typed error."""

    def __init__(self, group: Any, backend: str):
        self.group, self.backend = group, backend
        self.rank, self.size = group.rank(), group.size()

    @property
    def _stream(self):
        return mx.gpu if self.backend in _GPU_BACKENDS else mx.cpu

    def _all_gather(self, array: mx.array, doing: str) -> np.ndarray:
        try:
            gathered = mx.distributed.all_gather(array, group=self.group, stream=self._stream)
            mx.eval(gathered)
        except RuntimeError as error:
            raise SpeechlensError(
                f"rank {self.rank} of {self.size}: lost the other ranks while {doing} ({error}); "
                "every output already written is complete: run the same command again with "
                "--skip-existing to finish the rest") from None
        return np.array(gathered)

    def all_gather_bytes(self, data: bytes, doing: str = "gathering the results") -> list[bytes]:
        """Every rank's `data`, in rank order: lengths first, then the bytes padded to the
        longest, gathered as uint8 (all_gather needs one shape on every rank)."""
        lengths = self._all_gather(mx.array([len(data)], dtype=mx.int32), doing).tolist()
        width = max(max(lengths), 1)
        padded = np.zeros(width, np.uint8)
        padded[:len(data)] = np.frombuffer(data, np.uint8)
        blob = self._all_gather(mx.array(padded), doing)
        return [blob[rank * width:rank * width + length].tobytes()
                for rank, length in enumerate(lengths)]

    def barrier(self) -> None:
        try:
            mx.eval(mx.distributed.all_sum(mx.array(1), group=self.group, stream=self._stream))
        except RuntimeError:
            pass  # a rank already left; everything has been reported
