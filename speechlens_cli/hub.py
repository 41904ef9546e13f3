"""Fetching a checkpoint's files from the Hugging Face hub: every failure one line within
seconds, and nothing left in the cache that does not match its pinned checksum.

huggingface_hub does the transfer (its cache layout, its resume of a transfer cut short), and
every request goes through its client, so a proxy set for it (HTTPS_PROXY, HTTP_PROXY) is used.
speechlens first asks for each file's metadata itself, once, with a short timeout: the client's
own fallback retries a failing hub for ~25 s (500) and a silent one for minutes (five 60-s waits).
The cache is read with checks of its own: an entry that cannot be read is an error naming it,
never taken for a file that is missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from . import settings
from .errors import ChecksumMismatchError, ModelNotFoundError, UsageError

#: Seconds to wait for the hub to connect and answer a metadata request.
#: The transfer itself waits huggingface_hub's HF_HUB_DOWNLOAD_TIMEOUT (10 s) per block and
#: resumes a cut transfer up to five times.
HUB_TIMEOUT_S = 5.0
_LOCAL_COPY = "pass a local copy with --model PATH"
_COMMIT = re.compile(r"[0-9a-f]{40}")


def check_endpoint() -> None:
    """Refuse an HF_ENDPOINT that does not parse before huggingface_hub is imported: the
    library parses it at import, and a bad port or a stray bracket raised from the import
    itself. Every import of the library here comes after this check."""
    value = settings.HF_ENDPOINT.raw()
    if value:
        _check_url(value)


def endpoint() -> str:
    """HF_ENDPOINT as set now (huggingface_hub reads it once, at import), checked."""
    check_endpoint()
    from huggingface_hub import constants

    value = settings.HF_ENDPOINT.raw() or constants.ENDPOINT
    _check_url(value)
    return value.rstrip("/")


def _check_url(value: str) -> None:
    """An http(s) URL with a host and a port that parses, or a usage error naming HF_ENDPOINT."""
    try:
        address = urlsplit(value)
        usable = address.scheme in ("http", "https") and bool(address.hostname) \
            and address.port != 0   # .port raises on a port that does not parse
    except ValueError as error:
        raise UsageError(f"HF_ENDPOINT: {value!r} is not a URL ({error}); set it like "
                         "https://huggingface.co, or unset it") from None
    if not usable:
        raise UsageError(f"HF_ENDPOINT: {value!r} is not an http(s) URL with a host and port; "
                         "set it like https://huggingface.co, or unset it")


def cache_dir() -> str | None:
    """HF_HUB_CACHE as set now, for the same reason."""
    return settings.HF_HUB_CACHE.raw() or None


def cache_folder() -> Path:
    """The Hugging Face cache the client uses now: HF_HUB_CACHE, else its default."""
    check_endpoint()
    from huggingface_hub import constants

    return Path(cache_dir() or constants.HF_HUB_CACHE)


def cached(repo_id: str, name: str, revision: str | None) -> str | None:
    """The file's path in the cache, or None where it is not there. Read from the cache folders
    alone: the client's own local lookup (hf_hub_download with local_files_only) contacts the
    hub for its agent-detection registry, before any license was accepted and even when nothing
    is missing; and its try_to_load_from_cache takes what it cannot read for missing (a
    download or "not in the cache" followed). What cannot be read is an error naming it."""
    cache = _checked_cache()
    from huggingface_hub.file_download import repo_folder_name

    folder = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    try:
        if revision is None:
            revision = (folder / "refs" / "main").read_text(encoding="ascii").strip()
            if not _COMMIT.fullmatch(revision):
                return None
        path = folder / "snapshots" / revision / name
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return None
    except OSError as error:
        raise _unreadable_cache(error) from None
    if not stat.S_ISREG(mode):
        raise ModelNotFoundError(f"{path}: in the Hugging Face cache, is not a file; remove it "
                                 "and run `speechlens models pull`")
    return str(path)


@dataclass(frozen=True)
class CachedRevision:
    """A revision in the cache that holds the file asked for (cached_revisions)."""

    repo_id: str
    commit: str
    folder: Path
    size: int   # bytes of the files in the revision's folder


def cached_revisions(name: str) -> tuple[list[CachedRevision], list[str]]:
    """Every model revision in the cache holding `name`, and a line for each entry that cannot
    be read (never taken for one that is missing). huggingface_hub's scan_cache_dir raises on a
    cache that is a file or a link loop, and drops a whole repo on any entry it cannot read."""
    cache = _checked_cache()
    try:
        entries = sorted(os.listdir(cache))
    except FileNotFoundError:
        return [], []
    except OSError as error:
        raise _unreadable_cache(error) from None
    found, problems = [], []
    for entry in entries:
        if not entry.startswith("models--"):
            continue
        snapshots = cache / entry / "snapshots"
        try:
            commits = sorted(os.listdir(snapshots))
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as error:
            problems.append(_cannot_be_read(error))
            continue
        for commit in commits:
            folder = snapshots / commit
            try:
                os.stat(folder / name)
                size = _folder_size(folder)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as error:
                problems.append(_cannot_be_read(error))
                continue
            repo_id = entry.removeprefix("models--").replace("--", "/")
            found.append(CachedRevision(repo_id, commit, folder, size))
    return found, problems


def _folder_size(folder: Path) -> int:
    """Bytes of the files in `folder` (links followed; a dangling one counts nothing)."""
    size = 0
    for entry in os.listdir(folder):
        with contextlib.suppress(FileNotFoundError):
            status = os.stat(folder / entry)
            if stat.S_ISREG(status.st_mode):
                size += status.st_size
    return size


def _checked_cache() -> Path:
    """The cache folder, which may be missing (a download makes it), but not something else."""
    cache = cache_folder()
    try:
        mode = os.stat(cache).st_mode
    except FileNotFoundError:
        return cache
    except OSError as error:
        raise _unreadable_cache(error) from None
    if not stat.S_ISDIR(mode):
        raise ModelNotFoundError(f"{cache}: the Hugging Face cache (HF_HUB_CACHE) is not a "
                                 "folder; point HF_HUB_CACHE at a folder")
    return cache


def _cannot_be_read(error: OSError) -> str:
    return f"{error.filename}: cannot be read ({error.strerror or error})"


def _unreadable_cache(error: OSError) -> ModelNotFoundError:
    """The one line for a part of the cache the operating system refuses to read."""
    return ModelNotFoundError(f"{_cannot_be_read(error)}; the Hugging Face cache there needs "
                              "fixing (or HF_HUB_CACHE pointed elsewhere)")


def download(repo_id: str, name: str, revision: str | None, *,
             sha256: str | None = None) -> str:
    """Fetch one file into the cache and return its path there. With `sha256`, a file that does
    not match is removed from the cache again before the error is raised."""
    endpoint()   # a usage error, before any request, where HF_ENDPOINT does not parse
    from huggingface_hub import hf_hub_download

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


def _proxy() -> str | None:
    """The proxy the client goes through to the hub, as the environment sets it (for messages).
    urllib.request is imported here, on a failed download: it brings ssl and http.client, which
    every start of speechlens would otherwise pay for."""
    import urllib.request

    address = urlsplit(endpoint())
    if urllib.request.proxy_bypass_environment(address.hostname or ""):
        return None
    proxies = urllib.request.getproxies_environment()
    return proxies.get(address.scheme) or proxies.get("all")


def _ask_metadata(repo_id: str, name: str, revision: str | None) -> None:
    """One HEAD on the file, no retries: a refusal or a silent hub raises here, at once. The
    URL is the hub's resolve URL at endpoint(): hf_hub_url swaps its `endpoint` in only where
    its import-time template starts with its import-time ENDPOINT, and kept huggingface.co
    otherwise (a test that set the one without the other reached the real hub)."""
    from huggingface_hub import get_hf_file_metadata

    url = (f"{endpoint()}/{repo_id}/resolve/{quote(revision or 'main', safe='')}/"
           f"{quote(name)}")
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
    if names & {"ConnectError", "ConnectionError", "ProxyError"}:
        text = str(error).strip()
        reason = re.sub(r"^\[Errno -?\d+\] ", "", text.splitlines()[0]) if text else kind
        proxy = _proxy()
        through = f" through the proxy {proxy}" if proxy else ""
        return (f"the Hugging Face hub ({_host()}) cannot be reached{through} ({reason}): run "
                f"`speechlens models pull` where it is reachable, or {_LOCAL_COPY}")
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
