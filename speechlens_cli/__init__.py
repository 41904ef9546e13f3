"""speechlens: clean up recorded speech with NVIDIA's RE-USE model on Apple MLX.

Importing the package changes nothing in the process and does not import MLX. `enhance`,
`enhance_file` and `get_model` here are speechlens_cli.api's, reached through functions that
first prepare the process (speechlens_cli.runtime.prepare: full float32, the optimized BLAS on
Linux, which must be loaded before MLX is imported, glibc's large-block settings; its
docstring says what, and how to undo or decline it), then import the API.
"""

from __future__ import annotations

from . import runtime

__version__ = "0.1.0"


def enhance(*args, **kwargs):
    """speechlens_cli.api.enhance, after runtime.prepare() (same arguments)."""
    runtime.prepare()
    from .api import enhance as run

    return run(*args, **kwargs)


def enhance_file(*args, **kwargs):
    """speechlens_cli.api.enhance_file, after runtime.prepare() (same arguments)."""
    runtime.prepare()
    from .api import enhance_file as run

    return run(*args, **kwargs)


def get_model(*args, **kwargs):
    """speechlens_cli.api.get_model, after runtime.prepare() (same arguments): load the model
    once, pass it to every call."""
    runtime.prepare()
    from .api import get_model as run

    return run(*args, **kwargs)


__all__ = ["enhance", "enhance_file", "get_model", "runtime", "__version__"]
