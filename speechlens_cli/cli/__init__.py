"""The `speechlens` command: a thin Click layer over the Python API.

``app`` holds the group and turns every typed error into one line and an exit code; each
command has its module (``models``, ``doctor``, ``enhance``, ``formats``, ``score``; ``speechlens
bench`` lives in speechlens_cli/bench/); ``jobs``, ``runner`` and ``reporting`` are enhance's
parts.
"""

from __future__ import annotations

from ..bench import bench_command
from . import demo, doctor, enhance, formats, models, score  # noqa: F401  (each registers a command)
from .app import main

main.add_command(bench_command)

__all__ = ["main"]
