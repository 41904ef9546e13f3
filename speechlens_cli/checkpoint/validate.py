"""Whether a checkpoint is RE-USE's: the safetensors header, config.json and the layout
checked against the model, before any tensor is read or allocated."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import (
    CheckpointFormatError,
    ChecksumMismatchError,
    IncompatibleModelError,
    ModelNotFoundError,
)
from ..hub import file_sha256
from ..model.config import ModelConfig
from ..model.layout import expected_shapes, shapes_of
from ..model.semamba import SEMamba
from .locate import CheckpointFiles, names_the_variable, resolve

#: A safetensors header is parsed only up to this size: RE-USE's (1,416 tensors) is about 150 KB,
#: the largest configuration admitted (below) under 1 MB; JSON parsing costs ~25 times the text.
_MAX_HEADER_BYTES = 4 * 1024 * 1024
#: Parameters a configuration may have: ten times RE-USE's 9,607,747 (the config limits alone
#: admitted 3.6e9, 14 GB of float32 before any window).
MAX_PARAMETERS = 100_000_000
#: config.json is read whole only up to this size (the official one is a few hundred bytes).
_MAX_CONFIG_BYTES = 1024 * 1024
_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2,
                "I8": 1, "U8": 1, "BOOL": 1}
_OPTIONAL_PREFIXES = ("model.", "SEMamba.")


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True)
class CheckpointReport:
    source: str
    weights: Path
    config: ModelConfig
    tensor_count: int
    parameter_count: int
    sha256: str


def read_header(path: Path) -> tuple[dict[str, TensorEntry], int]:
    """Parse and bounds-check a safetensors header; returns the entries and the data offset."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise CheckpointFormatError(f"{path}: not a safetensors file (only {size} bytes)")
        header_len = int.from_bytes(prefix, "little")
        if size - 8 >= header_len > _MAX_HEADER_BYTES:
            raise CheckpointFormatError(
                f"{path}: header claims {header_len} bytes, over the {_MAX_HEADER_BYTES >> 20} MB "
                "a checkpoint header may have (RE-USE's is about 150 KB): not parsed")
        if header_len > size - 8:
            raise CheckpointFormatError(
                f"{path}: not a safetensors file or truncated (header claims {header_len} bytes, "
                f"file has {size})"
            )
        raw = handle.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointFormatError(
            f"{path}: not a safetensors file (header is not JSON)") from None
    except (RecursionError, ValueError):  # absurdly nested, or integers of thousands of digits
        raise CheckpointFormatError(f"{path}: not a safetensors file (header JSON is absurd)") \
            from None
    if not isinstance(header, dict):
        raise CheckpointFormatError(f"{path}: not a safetensors file (header is not an object)")
    data_start = 8 + header_len
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            if not all(isinstance(v, int) and v >= 0 for v in (*shape, start, end)):
                raise TypeError
        except (TypeError, KeyError, ValueError):
            raise CheckpointFormatError(f"{path}: malformed header entry for {name!r}") from None
        width = _DTYPE_BYTES.get(dtype)
        if width is None or end - start != width * math.prod(shape) or start > end:
            raise CheckpointFormatError(f"{path}: header entry {name!r} has inconsistent size")
        if data_start + end > size:
            raise CheckpointFormatError(
                f"{path}: truncated ({size} bytes, tensor {name!r} ends at byte {data_start + end})"
            )
        entries[name] = TensorEntry(dtype, shape, start, end)
    return entries, data_start


def canonical_name(name: str) -> str:
    for prefix in _OPTIONAL_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def check_layout(entries: dict[str, TensorEntry], expected: dict[str, tuple[int, ...]],
                 source: str) -> None:
    """Exact key set, every shape (`expected`: layout.expected_shapes), float32: the
    architecture the model and kernels require."""
    found = {canonical_name(k): v for k, v in entries.items()}
    missing = [k for k in expected if k not in found]
    extra = sorted(k for k in found if k not in expected)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise IncompatibleModelError(f"{source}: missing tensor {missing[0]}{more}")
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise IncompatibleModelError(f"{source}: unexpected tensor {extra[0]}{more}")
    for name, shape in expected.items():
        entry = found[name]
        if entry.shape != shape:
            raise IncompatibleModelError(
                f"{source}: tensor {name} has shape {list(entry.shape)}, expected {list(shape)}"
            )
        if entry.dtype != "F32":
            raise IncompatibleModelError(
                f"{source}: tensor {name} is {entry.dtype}, expected F32"
            )


def _read_config(files: CheckpointFiles) -> ModelConfig:
    if files.config is None:
        return ModelConfig()
    try:
        with open(files.config, "rb") as handle:
            text = handle.read(_MAX_CONFIG_BYTES + 1)
        if len(text) > _MAX_CONFIG_BYTES:
            raise IncompatibleModelError(
                f"{files.config}: config.json is over {_MAX_CONFIG_BYTES // 1024} KB (the "
                "official one is under 1 KB): not a model configuration")
        raw = json.loads(text.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise IncompatibleModelError(f"{files.config}: unreadable config.json ({error})") from None
    except (RecursionError, ValueError):  # absurdly nested, or integers of thousands of digits
        raise IncompatibleModelError(f"{files.config}: unreadable config.json (absurd JSON)") \
            from None
    try:
        return ModelConfig.from_dict(raw)
    except IncompatibleModelError as error:  # name the checkpoint the config belongs to
        raise IncompatibleModelError(f"{files.config.parent}: {error}") from None


def planning_config(spec: str | os.PathLike | None = None) -> ModelConfig:
    """The configuration a dry run checks files against, without the weights: the checkpoint's
    config.json where it is on this machine, else the official one, which a download brings."""
    try:
        files = resolve(spec, download=False)
    except ModelNotFoundError:
        return ModelConfig()
    return _read_config(files)


@names_the_variable
def inspect(spec: str | os.PathLike | None = None, *, download: bool = True) -> CheckpointReport:
    """Everything `models verify` reports; raises the typed error of the first problem found."""
    files = resolve(spec, download=download)
    try:
        return _inspect(files)
    except OSError as error:  # EIO from a failing disk, a file removed meanwhile
        raise unreadable(files.weights, error) from None


def unreadable(path: Path, error: OSError) -> CheckpointFormatError:
    """The one line for a checkpoint the operating system fails to read."""
    return CheckpointFormatError(f"{path}: cannot be read ({error.strerror or error})")


def _check_size(shapes: dict[str, tuple[int, ...]], source: str) -> None:
    parameters = sum(math.prod(shape) for shape in shapes.values())
    if parameters > MAX_PARAMETERS:
        raise IncompatibleModelError(
            f"{source}: config.json describes {parameters:,} parameters; speechlens loads at most "
            f"{MAX_PARAMETERS:,} (RE-USE has 9,607,747)")


def _inspect(files: CheckpointFiles) -> CheckpointReport:
    checked = validate(files)
    digest = checked.sha256 or file_sha256(files.weights)
    parameters = sum(math.prod(e.shape) for e in checked.entries.values())
    return CheckpointReport(files.source, files.weights, checked.config, len(checked.entries),
                            parameters, digest)


@dataclass(frozen=True)
class Validated:
    config: ModelConfig
    entries: dict[str, TensorEntry]
    data_start: int
    sha256: str | None  # only where a pinned file was checksummed
    model: SEMamba | None  # the model the layout was read off, where asked for (build)


def validate(files: CheckpointFiles, *, build: bool = False) -> Validated:
    """Checksum (a pinned file only), config, size, header and layout: what both `inspect` and
    `load_model` need, done once. A pinned file is checksummed first: a download cut short then
    reads as what it is (with the fix), not as a truncated or malformed safetensors file.
    With `build`, the layout is read off a new model, kept for the weights: building one takes
    tens of milliseconds, and `load_model` would otherwise build two."""
    digest = file_sha256(files.weights) if files.expected_sha256 else None
    if digest is not None and digest != files.expected_sha256:
        raise ChecksumMismatchError(
            f"{files.weights}: sha256 {digest[:12]}... does not match the pinned "
            f"{files.expected_sha256[:12]}... (a partial or altered download): delete it and run "
            "`speechlens models pull`"
        )
    cfg = _read_config(files)
    model = SEMamba(cfg, files.source) if build else None
    shapes = expected_shapes(cfg) if model is None else shapes_of(model)
    _check_size(shapes, files.source)
    entries, data_start = read_header(files.weights)
    check_layout(entries, shapes, files.source)
    return Validated(cfg, entries, data_start, digest, model)
