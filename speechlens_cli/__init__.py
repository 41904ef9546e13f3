"""speechlens: clean up recorded speech with NVIDIA's RE-USE model on Apple MLX."""

__version__ = "0.1.0"

import os  # noqa: E402

# Full float32 matmuls and convolutions. MLX runs them at TF32 precision by default on CUDA
# (and on M5 Metal): measured on an H200, that moved the enhanced waveform by 1.6e-3-3.3e-3
# relative RMSE against the float64 reference, against ~8e-6 in float32. Set
# MLX_ENABLE_TF32=1 yourself to trade that accuracy for speed.
os.environ.setdefault("MLX_ENABLE_TF32", "0")

from . import blas  # noqa: E402  (must run before anything imports mlx.core)

blas.preload()

from .api import enhance, enhance_file  # noqa: E402

__all__ = ["enhance", "enhance_file", "__version__"]
