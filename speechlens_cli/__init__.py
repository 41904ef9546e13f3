"""speechlens: clean up recorded speech with NVIDIA's RE-USE model on Apple MLX."""

__version__ = "0.1.0"

import os  # noqa: E402

# Full float32 matmuls and convolutions. MLX runs them at TF32 precision by default on CUDA
# (and on M5 Metal): measured on an H200, that moved the enhanced waveform by 1.6e-3-3.3e-3
# relative RMSE against the float64 reference, against ~8e-6 in float32. Set
# MLX_ENABLE_TF32=1 yourself to trade that accuracy for speed.
os.environ.setdefault("MLX_ENABLE_TF32", "0")

from . import blas, heap  # noqa: E402  (must run before anything imports mlx.core)

blas.preload()
heap.keep_large_buffers()

import mlx.core as _mx  # noqa: E402

# MLX's CUDA backend keeps every input of an op until the command graph holding it completes,
# and closes a graph only once the arrays bound to it pass MLX_MAX_MB_PER_BUFFER (counted in
# millions of elements, not bytes; 1000 on an H100/H200): those pending graphs, not the model,
# set the peak memory. Measured on an H200, 5 s at 44.1 kHz (both BiMamba directions per
# launch): 3.34 GiB at 25, 2.14 GiB at 10, 2.15 GiB at 5, for 0.184 / 0.189 / 0.193 s (a row
# of docs/performance.md's tried-and-lost table); a 30-s window at 48 kHz 1.19 s at 25 and at
# 10. Read by MLX at the first GPU operation; a value in the environment wins. Metal keeps its
# own limits.
CUDA_GRAPH_MB = 10
if _mx.cuda.is_available():
    os.environ.setdefault("MLX_MAX_MB_PER_BUFFER", str(CUDA_GRAPH_MB))

from .api import enhance, enhance_file  # noqa: E402

__all__ = ["enhance", "enhance_file", "__version__"]
