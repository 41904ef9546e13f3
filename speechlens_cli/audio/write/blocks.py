"""What both writers (sink: libsndfile's containers, remux: media through PyAV) do alike: blocks
clamped to full scale where the encoding is integer, and the one failure of a read-back that
comes up short."""

from __future__ import annotations

import numpy as np

from ...errors import OutputError


def clamped(block: np.ndarray) -> tuple[np.ndarray, int]:
    """`block` within full scale [-1, 1], which an integer encoding holds, and how many of its
    samples were beyond it (counted: the run reports them)."""
    over = int(np.count_nonzero(np.abs(block) > 1.0))
    return (np.clip(block, -1.0, 1.0), over) if over else (block, 0)


def incomplete(shown: str, got: int, frames: int) -> OutputError:
    """A closed output that decodes fewer frames than were written: never published."""
    return OutputError(f"{shown}: the written file does not read back complete ({got} of "
                       f"{frames} frames decode): the disk may be full")
