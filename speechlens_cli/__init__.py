"""speechlens: clean up recorded speech with NVIDIA's RE-USE model on Apple MLX."""

__version__ = "0.1.0"

from .api import enhance  # noqa: E402

__all__ = ["enhance", "__version__"]
