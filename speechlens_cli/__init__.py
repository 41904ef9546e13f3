"""speechlens: clean up recorded speech with NVIDIA's RE-USE model on Apple MLX."""

__version__ = "0.1.0"

from . import blas  # noqa: E402  (must run before anything imports mlx.core)

blas.preload()

from .api import enhance, enhance_file  # noqa: E402

__all__ = ["enhance", "enhance_file", "__version__"]
