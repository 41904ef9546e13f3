"""Fetching a checkpoint's files from the Hugging Face hub: every failure one line within
seconds, and nothing left in the cache that does not match its pinned checksum.

huggingface_hub does the transfer (its cache layout, its resume of a transfer cut short).
speechlens first asks for each file's metadata itself, once, with a short timeout: the client's
own fallback retries a failing hub for ~25 s (500) and a silent one for minutes (five 60-s waits).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
from urllib.parse import urlsplit

from .errors import ChecksumMismatchError, ModelNotFoundError

#: Seconds to wait for the hub to accept a connection, and then to answer a metadata request.
#: The transfer itself waits huggingface_hub's HF_HUB_DOWNLOAD_TIMEOUT (10 s) per block and
#: resumes a cut transfer up to five times.
HUB_TIMEOUT_S = 5.0
_LOCAL_COPY = "pass a local copy with --model PATH"


def endpoint() -> str:
    """HF_ENDPOINT as set now: huggingface_hub reads it once, at import."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def cache_dir() -> str | None:
    """HF_HUB_CACHE as set now, for the same reason."""
    return os.environ.get("HF_HUB_CACHE") or None


def cached(repo_id: str, name: str, revision: str | None) -> str | None:
    """The file's path in the cache, or None. Read from the cache folders alone: the client's
    own local lookup (hf_hub_download with local_files_only) contacts the hub for its
    agent-detection registry, before any license was accepted and even when nothing is missing."""
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(repo_id, name, cache_dir=cache_dir(), revision=revision)
    except (OSError, ValueError):
        return None
    return path if isinstance(path, str) else None


def download(repo_id: str, name: str, revision: str | None, *,
             sha256: str | None = None) -> str:
    """Fetch one file into the cache and return its path there. With `sha256`, a file that does
    not match is removed from the cache again before the error is raised."""
    from huggingface_hub import hf_hub_download

    _check_reachable()
    with _quiet_client():
        with _one_line(repo_id, name, revision, f"did not answer within {HUB_TIMEOUT_S:g} s"):
            _ask_metadata(repo_id, name, revision)
        with _one_line(repo_id, name, revision, "stopped sending it and did not resume"):
            path = hf_hub_download(repo_id, name, revision=revision, cache_dir=cache_dir(),
                                   endpoint=endpoint(), etag_timeout=HUB_TIMEOUT_S)
    if sha256 is not None:
        _keep_only_if_pinned(path, sha256, repo_id, name)
    return path


@contextlib.contextmanager
def _one_line(repo_id: str, name: str, revision: str | None, stalled: str):
    """Network, auth, a missing file, a silent hub: each becomes one line naming the fix."""
    try:
        yield
    except Exception as error:
        raise ModelNotFoundError(failure(error, repo_id, name, revision, stalled)) from None


def _host() -> str:
    return urlsplit(endpoint()).hostname or "huggingface.co"


def _check_reachable() -> None:
    """Fail in seconds, naming the fix, where the hub cannot be reached at all."""
    address = urlsplit(endpoint())
    port = address.port or (443 if address.scheme == "https" else 80)
    try:
        socket.create_connection((_host(), port), timeout=HUB_TIMEOUT_S).close()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ModelNotFoundError(
            f"the Hugging Face hub ({_host()}) cannot be reached ({reason}): run `speechlens "
            f"models pull` where it is reachable, or {_LOCAL_COPY}") from None


def _ask_metadata(repo_id: str, name: str, revision: str | None) -> None:
    """One HEAD on the file, no retries: a refusal or a silent hub raises here, at once."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo_id, name, revision=revision, endpoint=endpoint())
    get_hf_file_metadata(url, timeout=HUB_TIMEOUT_S)


@contextlib.contextmanager
def _quiet_client():
    """The client's retry warnings would break the one-line errors."""
    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub_logger.setLevel(level)


def failure(error: Exception, repo_id: str, name: str, revision: str | None,
            stalled: str) -> str:
    """The one line for a failed metadata request or transfer (`stalled`: what a timeout
    means in that step)."""
    status = getattr(getattr(error, "response", None), "status_code", None)
    kind = type(error).__name__
    # By name: the client's HTTP library changed between its versions (requests, httpx).
    names = {cls.__name__ for cls in type(error).__mro__}
    at = f"{repo_id}@{revision or 'main'}"
    if kind == "RevisionNotFoundError":
        return f"{at}: the hub has no such revision (404): {_LOCAL_COPY}"
    if kind in ("RemoteEntryNotFoundError", "EntryNotFoundError"):
        return f"{at}: the hub has no {name} there (404): {_LOCAL_COPY}"
    if status in (401, 403) or kind in ("RepositoryNotFoundError", "GatedRepoError"):
        return (f"{repo_id}: the hub refused access ({status or 'not found'}): the repo is "
                "missing, private or gated; if you have access, set HF_TOKEN (or run `hf auth "
                f"login`), or {_LOCAL_COPY}")
    if status is not None and status >= 500:
        return (f"the Hugging Face hub ({_host()}) failed with {status} serving {name} of "
                f"{repo_id}: try again later, or {_LOCAL_COPY}")
    if any("Timeout" in cls for cls in names):
        return (f"the Hugging Face hub ({_host()}) {stalled} ({name} of {repo_id}): try "
                f"again later, or {_LOCAL_COPY}")
    return (f"could not download {name} from {repo_id} ({kind}): check the network, or "
            f"{_LOCAL_COPY}")


def _keep_only_if_pinned(path: str, expected: str, repo_id: str, name: str) -> None:
    """A downloaded file whose sha256 is not the pinned one leaves the cache at once: kept, every
    later run would find it there and fail again, and `models pull` could not replace it."""
    digest = file_sha256(path)
    if digest == expected:
        return
    blob = os.path.realpath(path)
    for leftover in {path, blob}:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(leftover)
    raise ChecksumMismatchError(
        f"{repo_id}: the downloaded {name} has sha256 {digest[:12]}..., not the pinned "
        f"{expected[:12]}... (altered on the way or on the hub): not kept; try again, or "
        f"{_LOCAL_COPY}")


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
