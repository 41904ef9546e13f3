"""Find, download, validate and load RE-USE checkpoints (official PyTorch layout, no torch).

Validation reads only the safetensors header and config.json (and builds the model, whose
parameters are not allocated until loaded), so a wrong or damaged file is rejected with a typed
error before any tensor is read or allocated.

One module per job: ``locate`` (a local folder or file, or the hub: resolve, download, NVIDIA's
license), ``validate`` (header, config, layout; `inspect`) and ``load`` (the tensors into the
model the layout was checked against). Callers use the names here.
"""

from __future__ import annotations

from .load import load_model, sanitize
from .locate import (
    CONFIG_FILE,
    DEFAULT_REPO,
    LICENSE_ENV,
    LICENSE_NOTE,
    MODEL_ENV,
    PINNED_REVISION,
    PINNED_SHA256,
    WEIGHTS_FILE,
    CheckpointFiles,
    accept_license,
    is_repo_id,
    license_accepted,
    license_required,
    local_path,
    model_spec,
    needs_license,
    resolve,
)
from .validate import (
    MAX_PARAMETERS,
    CheckpointReport,
    TensorEntry,
    check_layout,
    inspect,
    planning_config,
    read_header,
    unreadable,
)

__all__ = [
    "CONFIG_FILE", "DEFAULT_REPO", "LICENSE_ENV", "LICENSE_NOTE", "MAX_PARAMETERS", "MODEL_ENV",
    "PINNED_REVISION", "PINNED_SHA256", "WEIGHTS_FILE", "CheckpointFiles", "CheckpointReport",
    "TensorEntry", "accept_license", "check_layout", "inspect", "is_repo_id", "license_accepted",
    "license_required", "load_model", "local_path", "model_spec", "needs_license",
    "planning_config", "read_header", "resolve", "sanitize", "unreadable",
]
