"""Where a checkpoint is: a local folder or file, or a Hugging Face repo (the pinned
nvidia/RE-USE, downloaded only with NVIDIA's license accepted)."""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from .. import hub, settings
from ..errors import (
    IncompatibleModelError,
    LicenseRequiredError,
    ModelNotFoundError,
    SpeechlensError,
    UsageError,
)

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
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class CheckpointFiles:
    weights: Path
    config: Path | None
    source: str
    expected_sha256: str | None = None


def names_the_variable(function):
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


@names_the_variable
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
    """HF_HUB_OFFLINE set on, spelled as huggingface_hub accepts it."""
    return settings.HF_HUB_OFFLINE.value()


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
