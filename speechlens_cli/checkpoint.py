"""Find, download, validate and load RE-USE checkpoints (official PyTorch layout, no torch).

Validation reads only the safetensors header and config.json (and builds the model, whose
parameters are not allocated until loaded), so a wrong or damaged file is rejected with a typed
error before any tensor is read or allocated.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from . import hub, settings
from .errors import (
    CheckpointFormatError,
    ChecksumMismatchError,
    IncompatibleModelError,
    LicenseRequiredError,
    ModelNotFoundError,
    SpeechlensError,
    UsageError,
)
from .hub import file_sha256
from .model.config import ModelConfig
from .model.layout import expected_shapes, shapes_of, to_mlx_layout
from .model.semamba import SEMamba

DEFAULT_REPO = "nvidia/RE-USE"
#: The revision and checksum SpeechLens verified against; other revisions are not pinned.
PINNED_REVISION = "fe51d6495e49a1b7c28ef6e3a43820f841c944fc"
PINNED_SHA256 = "87a4a970ce9aa79d5d92e71899ab034defcf13d93e5e4393ec0dc7db6d4ec048"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MODEL_ENV = settings.MODEL.name
LICENSE_NOTE = (
    "RE-USE's weights are NVIDIA's, under the NVIDIA One-Way Noncommercial License (NSCLv1): "
    "you may use them, and anything converted or derived from them, for non-commercial "
    "research or evaluation only; redistribution must carry the same license and NVIDIA's "
    "notices. Full terms: https://huggingface.co/nvidia/RE-USE (model card, license: NSCLv1)."
)
#: Set to 1 to accept NVIDIA's license for scripts (the CLI's --accept-license does the same).
LICENSE_ENV = settings.ACCEPT_LICENSE.name
_license_accepted = False

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
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class CheckpointFiles:
    weights: Path
    config: Path | None
    source: str
    expected_sha256: str | None = None


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


# --------------------------------------------------------------------------- locating files

def _names_the_variable(function):
    """`function(spec, ...)`, whose errors name $SPEECHLENS_MODEL when the checkpoint came from
    it (spec None): a user who never typed the path sees where it was set."""
    @functools.wraps(function)
    def wrapper(spec=None, *args, **kwargs):
        value = settings.MODEL.value() if spec is None or str(spec) == "" else None
        try:
            return function(spec, *args, **kwargs)
        except SpeechlensError as error:
            message = str(error)
            if not value or message.startswith(f"{MODEL_ENV}="):   # named by an inner call
                raise
            named = (f"{MODEL_ENV}={message}" if message.startswith(f"{value}:")
                     else f"{MODEL_ENV}={value}: {message}")
            raise type(error)(named) from None
    return wrapper


@_names_the_variable
def resolve(spec: str | os.PathLike | None = None, *, download: bool = True) -> CheckpointFiles:
    """A local directory, a .safetensors file, or a Hugging Face repo id -> the files to load.

    `None` means $SPEECHLENS_MODEL, else the pinned nvidia/RE-USE. The Hugging Face cache is
    tried first, so a cached model never touches the network.
    """
    spec = model_spec(spec)
    path, mode = local_path(spec)
    if mode is not None and stat.S_ISDIR(mode):
        weights = path / WEIGHTS_FILE
        if not weights.is_file():
            raise ModelNotFoundError(f"{path}: no {WEIGHTS_FILE} in this folder")
        return CheckpointFiles(weights, _config_beside(path / CONFIG_FILE), str(path))
    if mode is not None and stat.S_ISREG(mode):
        return CheckpointFiles(path, _config_beside(path.with_name(CONFIG_FILE)), str(path))
    if not is_repo_id(spec):
        raise ModelNotFoundError(f"{spec}: no such checkpoint file or folder")
    return _from_hub(spec, download=download)


def _config_beside(config: Path) -> Path | None:
    """config.json next to the weights, if there is one. Something else of that name (a folder,
    a pipe) is an error: ignored, the defaults would run and fail on the weights' shapes."""
    if not os.path.lexists(config):
        return None
    if not config.is_file():
        raise IncompatibleModelError(f"{config}: is not a regular file (a folder, a pipe or a "
                                     "dangling link); config.json must be a JSON file")
    return config


def model_spec(spec: str | os.PathLike | None = None) -> str:
    """The checkpoint asked for: `spec`, else $SPEECHLENS_MODEL, else the pinned nvidia/RE-USE."""
    if spec is None or str(spec) == "":
        return settings.MODEL.value() or DEFAULT_REPO
    return str(spec)


def local_path(spec: str) -> tuple[Path, int | None]:
    """`spec` as a local path, and the mode of what is there (None: nothing). A name no file
    can have (longer than the system takes, "~" of a user who does not exist) is a usage error,
    and what the system refuses to look at (a link loop, no permission) cannot be read: one
    line each, where Path's own checks raise."""
    try:
        path = Path(spec).expanduser()
    except RuntimeError:   # "~name" with no such user
        user = spec[1:].split("/")[0]
        raise UsageError(f"{spec}: there is no user {user!r} for '~{user}' to name") from None
    try:
        return path, os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return path, None
    except ValueError:   # an embedded NUL
        raise UsageError(f"{spec!r}: not a file name (it holds a NUL)") from None
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            raise UsageError(f"{spec}: no file can have this name ({error.strerror})") from None
        raise ModelNotFoundError(f"{spec}: cannot be read ({error.strerror or error})") \
            from None


def is_repo_id(spec: str) -> bool:
    """A Hugging Face id ("owner/name") rather than a local path: only those are downloaded."""
    if spec.startswith((".", "/", "~")) or not _REPO_ID.match(spec):
        return False
    return not os.path.exists(spec) and Path(spec).suffix not in (".safetensors", ".json")


def accept_license() -> None:
    """NVIDIA's license was shown and accepted in this process: downloads may go ahead."""
    global _license_accepted
    _license_accepted = True


def license_accepted() -> bool:
    """Accepted in this process, or by SPEECHLENS_ACCEPT_LICENSE; a value of it that says
    neither yes nor no is a SettingError naming it, not a silent no."""
    return _license_accepted or settings.ACCEPT_LICENSE.value()


def license_required(repo_id: str, accept_by: str = "run `speechlens models pull` in a "
                     f"terminal, or set {LICENSE_ENV}=1") -> LicenseRequiredError:
    """The one refusal for a download of NVIDIA's weights without their license accepted: the
    license once, then `accept_by`, the way to accept it open to whoever was refused."""
    return LicenseRequiredError(f"{repo_id} is not downloaded yet. {LICENSE_NOTE} To accept "
                                f"these terms and download it, {accept_by}")


def needs_license(spec: str | os.PathLike | None = None) -> bool:
    """True when using `spec` would download NVIDIA's weights and their license has not been
    accepted yet: the caller shows LICENSE_NOTE and asks first."""
    spec = model_spec(spec)
    if _offline() or not is_repo_id(spec) or not _is_nvidias(spec) or license_accepted():
        return False
    try:
        resolve(spec, download=False)
    except ModelNotFoundError:
        return True
    return False


def _offline() -> bool:
    return _env_true("HF_HUB_OFFLINE")


def _env_true(name: str) -> bool:
    """An environment switch set on, spelled as huggingface_hub accepts it."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _is_nvidias(repo_id: str) -> bool:
    return repo_id.lower() == DEFAULT_REPO.lower()


def _from_hub(repo_id: str, *, download: bool) -> CheckpointFiles:
    hub.check_endpoint()
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:  # the hub's own rule: is_repo_id only tells an id's shape from a path's
        validate_repo_id(repo_id)
    except HFValidationError as error:
        reason = str(error).strip().splitlines()[0].rstrip(".")
        raise UsageError(f"{repo_id}: no such checkpoint file or folder, and not a valid "
                         f"Hugging Face repo id ({reason})") from None

    pinned = repo_id == DEFAULT_REPO
    revision = PINNED_REVISION if pinned else None
    expected = PINNED_SHA256 if pinned else None
    offline = _offline()
    paths = {}
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        paths[name] = hub.cached(repo_id, name, revision)
        if paths[name] is not None:
            continue
        if not download or offline:
            raise ModelNotFoundError(
                f"{repo_id} is not in the Hugging Face cache"
                + (" and HF_HUB_OFFLINE is set" if offline else "")
                + f": run `speechlens models pull {repo_id}` where the hub is reachable, "
                "or pass a local copy with --model PATH"
            )
        if _is_nvidias(repo_id) and not license_accepted():
            raise license_required(repo_id)
        paths[name] = hub.download(repo_id, name, revision,
                                   sha256=expected if name == WEIGHTS_FILE else None)
    return CheckpointFiles(
        Path(paths[WEIGHTS_FILE]), Path(paths[CONFIG_FILE]),
        f"{repo_id}@{revision or 'main'}", expected,
    )


# --------------------------------------------------------------------------- validation

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


def _canonical_name(name: str) -> str:
    for prefix in _OPTIONAL_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def check_layout(entries: dict[str, TensorEntry], expected: dict[str, tuple[int, ...]],
                 source: str) -> None:
    """Exact key set, every shape (`expected`: layout.expected_shapes), float32: the
    architecture the model and kernels require."""
    found = {_canonical_name(k): v for k, v in entries.items()}
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


@_names_the_variable
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
    checked = _validate(files)
    digest = checked.sha256 or file_sha256(files.weights)
    parameters = sum(math.prod(e.shape) for e in checked.entries.values())
    return CheckpointReport(files.source, files.weights, checked.config, len(checked.entries),
                            parameters, digest)


@dataclass(frozen=True)
class _Validated:
    config: ModelConfig
    entries: dict[str, TensorEntry]
    data_start: int
    sha256: str | None  # only where a pinned file was checksummed
    model: SEMamba | None  # the model the layout was read off, where asked for (build)


def _validate(files: CheckpointFiles, *, build: bool = False) -> _Validated:
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
    return _Validated(cfg, entries, data_start, digest, model)


# --------------------------------------------------------------------------- loading

def sanitize(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """PyTorch layout -> MLX layout (the axis orders of model/layout.py), canonical names."""
    converted = {}
    for name, value in weights.items():
        converted[_canonical_name(name)] = np.ascontiguousarray(to_mlx_layout(value))
    return converted


def _read_tensors(path: Path, entries: dict[str, TensorEntry], data_start: int):
    """Read with read(), not mapped: a failing disk is then an OSError (one line), where a
    mapped page that cannot be read kills the process (SIGBUS)."""
    data = np.empty(max((e.end for e in entries.values()), default=0), np.uint8)
    with open(path, "rb") as handle:
        handle.seek(data_start)
        if handle.readinto(memoryview(data)) != len(data):
            raise OSError(errno.EIO, "the file ended early")
    return {
        name: np.frombuffer(data[e.start:e.end], dtype="<f4").reshape(e.shape)
        for name, e in entries.items()
    }


@_names_the_variable
def load_model(spec: str | os.PathLike | None = None, *, download: bool = True) -> SEMamba:
    """Resolve, validate, convert and load a checkpoint into an evaluated SEMamba. Validation
    is `inspect`'s, without an unpinned file's sha256, which only reports need."""
    files = resolve(spec, download=download)
    try:
        checked = _validate(files, build=True)
        weights = sanitize(_read_tensors(files.weights, checked.entries, checked.data_start))
    except OSError as error:
        raise unreadable(files.weights, error) from None
    for name, value in weights.items():
        if not np.isfinite(value).all():
            raise IncompatibleModelError(f"{files.source}: tensor {name} has NaN or Inf values")
    model = checked.model
    # not strict: check_layout matched the names and shapes to this very model's parameters
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=False)
    model.eval()
    mx.eval(model.parameters())
    model.prepare()
    return model
